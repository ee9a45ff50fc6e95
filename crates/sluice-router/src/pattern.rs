//! URI patterns: APISIX `uri` strings compiled into a trie key plus a segment matcher.
//!
//! Owns the classification of a URI (lua-resty-radixtree `common_route_data` + `fetch_pat`):
//! - no `:` and no `*` → **exact**;
//! - a single `*` as the last byte → **prefix** on what precedes it: `/foo/*` matches `/foo/`
//!   and `/foo/a/b` but not `/foo`; `/foo*` matches `/foo`, `/foobar` and `/foo/x`. A `*`
//!   that is a whole segment captures the rest under the name `:ext`, as radixtree does;
//! - otherwise a **pattern** keyed by the static prefix before the first `:`/`*`, matched over
//!   the whole path: a segment `:name` captures one non-empty segment (`[^/]+`), a segment
//!   `*name` captures any run of bytes including `/` (`.*`, greedy), other text is literal.
//!   Like radixtree, a URI with `:`/`*` but no such segment (`/v1/items:batch`) degrades to
//!   a prefix match on its static part.
//!
//! It does not do percent-decoding or path normalisation; the path is matched as given.

use crate::Params;

/// What the router stores per candidate to re-check the path after the trie walk.
#[derive(Debug, Clone)]
pub(crate) enum Matcher {
    /// Whole path equals the key (exact table) or starts with it (prefix table).
    None,
    /// Prefix match that captures everything after the key under `:ext`.
    Rest,
    /// Full match against tokens.
    Tokens(Box<[Token]>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Token {
    Lit(Box<[u8]>),
    Param(Box<str>),
    Wild(Box<str>),
}

/// A compiled URI: trie key, whether the key is exact, and the matcher.
#[derive(Debug, Clone)]
pub(crate) struct Pattern {
    pub(crate) key: String,
    pub(crate) exact: bool,
    pub(crate) matcher: Matcher,
}

/// Name radixtree gives to an unnamed `*` segment.
const UNNAMED_WILD: &str = ":ext";

impl Pattern {
    pub(crate) fn compile(uri: &str) -> Result<Pattern, String> {
        if uri.is_empty() {
            return Err("empty uri".into());
        }
        let first_special = uri.find([':', '*']);
        let Some(special) = first_special else {
            return Ok(Pattern {
                key: uri.to_owned(),
                exact: true,
                matcher: Matcher::None,
            });
        };
        let key = uri[..special].to_owned();
        let only_trailing_star = special == uri.len() - 1 && uri.ends_with('*');
        if only_trailing_star {
            let whole_segment = key.is_empty() || key.ends_with('/');
            return Ok(Pattern {
                key,
                exact: false,
                matcher: if whole_segment {
                    Matcher::Rest
                } else {
                    Matcher::None
                },
            });
        }
        let mut tokens = tokenize(uri);
        let has_capture = tokens.iter().any(|t| !matches!(t, Token::Lit(_)));
        // The trie has already compared the key: matching resumes right after it.
        if let Some(Token::Lit(first)) = tokens.first_mut() {
            if let Some(rest) = first.strip_prefix(key.as_bytes()) {
                if rest.is_empty() {
                    tokens.remove(0);
                } else {
                    *first = rest.into();
                }
            }
        }
        Ok(Pattern {
            key,
            exact: false,
            matcher: if has_capture {
                Matcher::Tokens(tokens.into_boxed_slice())
            } else {
                Matcher::None
            },
        })
    }
}

fn tokenize(uri: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut lit: Vec<u8> = Vec::new();
    for (i, seg) in uri.split('/').enumerate() {
        if i > 0 {
            lit.push(b'/');
        }
        let capture = if let Some(name) = seg.strip_prefix(':') {
            Some(Token::Param(name.into()))
        } else {
            seg.strip_prefix('*').map(|name| {
                let name = if name.is_empty() { UNNAMED_WILD } else { name };
                Token::Wild(name.into())
            })
        };
        match capture {
            Some(t) => {
                if !lit.is_empty() {
                    tokens.push(Token::Lit(std::mem::take(&mut lit).into_boxed_slice()));
                }
                tokens.push(t);
            }
            None => lit.extend_from_slice(seg.as_bytes()),
        }
    }
    if !lit.is_empty() {
        tokens.push(Token::Lit(lit.into_boxed_slice()));
    }
    tokens
}

impl Matcher {
    /// Checks `path` (already known to start with, or equal, the key of length `key_len`;
    /// tokens start right after the key) and records captures. On `false`, `params` is left
    /// as it was.
    #[inline]
    pub(crate) fn matches(&self, path: &str, key_len: usize, params: &mut Params) -> bool {
        match self {
            Matcher::None => true,
            Matcher::Rest => {
                params.push(UNNAMED_WILD, key_len..path.len());
                true
            }
            Matcher::Tokens(tokens) => {
                if key_len > path.len() {
                    return false;
                }
                let mark = params.mark();
                let ok = match_tokens(tokens, path.as_bytes(), key_len, params);
                if !ok {
                    params.truncate(mark);
                }
                ok
            }
        }
    }
}

fn match_tokens(tokens: &[Token], path: &[u8], pos: usize, params: &mut Params) -> bool {
    let Some((tok, rest)) = tokens.split_first() else {
        return pos == path.len();
    };
    match tok {
        Token::Lit(lit) => {
            path[pos..].starts_with(lit) && match_tokens(rest, path, pos + lit.len(), params)
        }
        Token::Param(name) => {
            let len = path[pos..]
                .iter()
                .position(|&b| b == b'/')
                .unwrap_or(path.len() - pos);
            if len == 0 {
                return false;
            }
            let mark = params.mark();
            params.push(name, pos..pos + len);
            if match_tokens(rest, path, pos + len, params) {
                return true;
            }
            params.truncate(mark);
            false
        }
        Token::Wild(name) => {
            // Greedy like PCRE's `(.*)`: the longest run that lets the rest match.
            let mark = params.mark();
            for end in (pos..=path.len()).rev() {
                params.push(name, pos..end);
                if match_tokens(rest, path, end, params) {
                    return true;
                }
                params.truncate(mark);
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(m: &Matcher, path: &str, key_len: usize) -> Option<Vec<(String, String)>> {
        let mut p = Params::new();
        m.matches(path, key_len, &mut p).then(|| {
            p.iter()
                .map(|(n, r)| (n.to_string(), path[r].to_string()))
                .collect()
        })
    }

    fn v(pairs: &[(&str, &str)]) -> Option<Vec<(String, String)>> {
        Some(
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        )
    }

    #[test]
    fn classify() {
        let p = Pattern::compile("/hello").unwrap();
        assert!(p.exact && p.key == "/hello");
        let p = Pattern::compile("/foo/*").unwrap();
        assert!(!p.exact && p.key == "/foo/" && matches!(p.matcher, Matcher::Rest));
        let p = Pattern::compile("/foo*").unwrap();
        assert!(!p.exact && p.key == "/foo" && matches!(p.matcher, Matcher::None));
        let p = Pattern::compile("/user/:id").unwrap();
        assert!(!p.exact && p.key == "/user/" && matches!(p.matcher, Matcher::Tokens(_)));
        let p = Pattern::compile("/v1/items:batch").unwrap();
        assert!(!p.exact && p.key == "/v1/items" && matches!(p.matcher, Matcher::None));
        assert!(Pattern::compile("").is_err());
    }

    #[test]
    fn params_and_wildcards() {
        let p = Pattern::compile("/user/:id/posts/:post").unwrap();
        let k = p.key.len();
        assert_eq!(
            caps(&p.matcher, "/user/7/posts/9", k),
            v(&[("id", "7"), ("post", "9")])
        );
        assert_eq!(caps(&p.matcher, "/user/7/posts/9/x", k), None);
        assert_eq!(caps(&p.matcher, "/user//posts/9", k), None);
        assert_eq!(caps(&p.matcher, "/user/7/posts/", k), None);

        let p = Pattern::compile("/user/:id/").unwrap();
        assert_eq!(caps(&p.matcher, "/user/7/", 6), v(&[("id", "7")]));
        assert_eq!(caps(&p.matcher, "/user/7", 6), None);

        let p = Pattern::compile("/files/*path").unwrap();
        assert_eq!(
            caps(&p.matcher, "/files/a/b.txt", 7),
            v(&[("path", "a/b.txt")])
        );
        assert_eq!(caps(&p.matcher, "/files/", 7), v(&[("path", "")]));

        let p = Pattern::compile("/a/*x/end").unwrap();
        assert_eq!(caps(&p.matcher, "/a/1/2/end", 3), v(&[("x", "1/2")]));
        assert_eq!(caps(&p.matcher, "/a/1/2/end/no", 3), None);

        let p = Pattern::compile("/foo/*").unwrap();
        assert_eq!(
            caps(&p.matcher, "/foo/bar/baz", 5),
            v(&[(":ext", "bar/baz")])
        );
    }

    #[test]
    fn failed_match_leaves_params_untouched() {
        let p = Pattern::compile("/u/:a/:b").unwrap();
        let mut params = Params::new();
        params.push("keep", 0..1);
        assert!(!p.matcher.matches("/u/1", 3, &mut params));
        assert_eq!(params.len(), 1);
    }
}
