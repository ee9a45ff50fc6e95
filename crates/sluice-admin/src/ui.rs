//! The dashboard's static files at `/ui/` on the admin listener (APISIX's path and its
//! `deployment.admin.enable_admin_ui` switch). The files are embedded at compile time: `ui/dist` as `make ui` builds
//! it (each file next to its `.br` and `.gz` forms, compressed by the UI build), or a placeholder page saying how to
//! build it (`build.rs`). The app needs no key to load; every Admin API call it makes sends the user's key.
//!
//! Paths are looked up in the embedded table only, never on disk; anything that is not a plain relative path
//! (a segment starting with a dot, empty segments, `%`, `\`) is refused before the lookup, so no spelling of a path can reach another
//! file or the Admin API's handlers.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::HeaderMap;
use hyper::{Response, StatusCode};
use rust_embed::Embed;

#[derive(Embed)]
#[folder = "$SLUICE_UI_DIR"]
struct Assets;

/// Whether this build carries the real UI (`ui/dist` was there) or the placeholder.
pub const BUILT: bool = matches!(env!("SLUICE_UI_BUILT").as_bytes(), b"1");
/// Changes whenever the embedded listing does: makes rustc rebuild this file when `ui/dist` changes.
const _STAMP: &str = env!("SLUICE_UI_STAMP");

/// No inline script or style, no eval, API calls to this origin only, never framed.
pub const CSP: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                       font-src 'self'; connect-src 'self'; manifest-src 'self'; base-uri 'none'; \
                       form-action 'none'; frame-ancestors 'none'";

/// Assets whose names carry their content hash (Vite's `assets/name-HASH.ext`) never change under a name.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";

type Resp = Response<Full<Bytes>>;

/// Answers a request whose path is `/ui` or starts with `/ui/`; `None` for any other path.
pub(crate) fn handle(method: &str, path: &str, headers: &HeaderMap) -> Option<Resp> {
    let rest = match path {
        "/ui" => return Some(redirect()),
        p => p.strip_prefix("/ui/")?,
    };
    if method != "GET" && method != "HEAD" {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed\n");
        r.headers_mut().insert(
            "allow",
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return Some(r);
    }
    if !clean(rest) {
        return Some(plain(StatusCode::NOT_FOUND, "404 Not Found\n"));
    }
    // The precompressed forms are served in place of their file, never under their own names.
    let variant = rest.ends_with(".br") || rest.ends_with(".gz");
    let (name, found) = if rest.is_empty() {
        ("index.html", true)
    } else {
        (rest, !variant && Assets::get(rest).is_some())
    };
    let name = if found {
        name
    } else if looks_like_asset(rest) {
        // A missing file, not an app URL: the SPA fallback would hand HTML to a script or style tag.
        return Some(plain(StatusCode::NOT_FOUND, "404 Not Found\n"));
    } else {
        // Deep link into the app (`/ui/routes/1`): the app routes it.
        "index.html"
    };
    Some(file(name, method == "HEAD", headers))
}

/// A relative path made only of ordinary segments.
fn clean(rest: &str) -> bool {
    if rest.contains(['%', '\\', '\0']) {
        return false;
    }
    if rest.is_empty() {
        return true;
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    // No segment starts with a dot: no `..`, `.`, `..;` or dotfiles (Vite names none so).
    rest.split('/')
        .all(|s| !s.is_empty() && !s.starts_with('.'))
}

/// A path the app never routes: the build's folder, or a file type the build emits. Resource ids may contain dots
/// (`/ui/routes/api.v2` is an app URL), so a dot alone does not make a file.
fn looks_like_asset(rest: &str) -> bool {
    const EXT: &[&str] = &[
        "js",
        "mjs",
        "css",
        "map",
        "html",
        "json",
        "txt",
        "png",
        "jpg",
        "svg",
        "ico",
        "webmanifest",
        "woff",
        "woff2",
        "wasm",
        "br",
        "gz",
    ];
    rest.starts_with("assets/")
        || rest
            .rsplit('/')
            .next()
            .and_then(|s| s.rsplit_once('.'))
            .is_some_and(|(_, ext)| EXT.contains(&ext.to_ascii_lowercase().as_str()))
}

fn file(name: &str, head: bool, headers: &HeaderMap) -> Resp {
    let Some(plain_file) = Assets::get(name) else {
        return plain(StatusCode::NOT_FOUND, "404 Not Found\n");
    };
    let mime = plain_file.metadata.mimetype().to_owned();
    let accepts = headers
        .get_all("accept-encoding")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    let mut encoding = None;
    let mut chosen = plain_file;
    for (enc, ext) in [("br", "br"), ("gzip", "gz")] {
        if accepts_encoding(&accepts, enc) {
            if let Some(f) = Assets::get(&format!("{name}.{ext}")) {
                chosen = f;
                encoding = Some(enc);
                break;
            }
        }
    }
    let hash = chosen.metadata.sha256_hash();
    let etag = format!(
        "\"{}\"",
        hash[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let cache = if name.starts_with("assets/") {
        IMMUTABLE
    } else {
        "no-cache"
    };
    let not_modified = headers
        .get_all("if-none-match")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            let t = t.trim();
            t == "*" || t.trim_start_matches("W/") == etag
        });
    let mut b = Response::builder()
        .header("content-type", mime)
        .header("cache-control", cache)
        .header("etag", &etag)
        .header("vary", "Accept-Encoding");
    b = security_headers(b);
    if let Some(enc) = encoding {
        b = b.header("content-encoding", enc);
    }
    if not_modified {
        return b
            .status(StatusCode::NOT_MODIFIED)
            .body(Full::new(Bytes::new()))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
    }
    let data = Bytes::from(chosen.data.into_owned());
    b = b.header("content-length", data.len());
    let body = if head { Bytes::new() } else { data };
    b.status(StatusCode::OK)
        .body(Full::new(body))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// `Accept-Encoding` lists `enc` with a non-zero q (RFC 9110 §12.5.3).
fn accepts_encoding(header: &str, enc: &str) -> bool {
    header.split(',').any(|item| {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim();
        if !name.eq_ignore_ascii_case(enc) {
            return false;
        }
        parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .all(|q| q.trim().parse::<f32>().is_ok_and(|q| q > 0.0))
    })
}

fn security_headers(b: hyper::http::response::Builder) -> hyper::http::response::Builder {
    b.header("content-security-policy", CSP)
        .header("x-content-type-options", "nosniff")
        .header("x-frame-options", "DENY")
        .header("referrer-policy", "no-referrer")
}

fn redirect() -> Resp {
    security_headers(Response::builder())
        .status(StatusCode::MOVED_PERMANENTLY)
        .header("location", "/ui/")
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(b"moved to /ui/\n")))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn plain(status: StatusCode, text: &'static str) -> Resp {
    security_headers(Response::builder())
        .status(status)
        .header("content-type", "text/plain")
        .header("cache-control", "no-cache")
        .body(Full::new(Bytes::from_static(text.as_bytes())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_paths_pass() {
        for ok in [
            "",
            "index.html",
            "assets/app-1a2b.js",
            "routes/1",
            "routes/",
        ] {
            assert!(clean(ok), "{ok}");
        }
        for bad in [
            "..",
            "../apisix/admin/routes",
            "assets/../../x",
            "./index.html",
            "a//b",
            "%2e%2e/x",
            "a%2fb",
            "..\\x",
            "a\0b",
            "..;/x",
            ".env",
        ] {
            assert!(!clean(bad), "{bad}");
        }
    }

    #[test]
    fn accept_encoding_q_values() {
        assert!(accepts_encoding("gzip, deflate, br", "br"));
        assert!(accepts_encoding("gzip;q=0.5", "gzip"));
        assert!(!accepts_encoding("gzip;q=0", "gzip"));
        assert!(!accepts_encoding("identity", "gzip"));
        assert!(!accepts_encoding("", "br"));
    }
}
