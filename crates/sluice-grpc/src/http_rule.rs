//! `google.api.http` bindings: one route serves every annotated method of a proto.
//!
//! Path template grammar (google/api/http.proto):
//! ```text
//! Template = "/" Segments [ Verb ] ;
//! Segments = Segment { "/" Segment } ;
//! Segment  = "*" | "**" | LITERAL | Variable ;
//! Variable = "{" FieldPath [ "=" Segments ] "}" ;
//! FieldPath = IDENT { "." IDENT } ;
//! Verb     = ":" LITERAL ;
//! ```
//! `**` must be the last segment. A single-segment capture is fully percent-decoded; a multi-segment one keeps
//! `%2F` encoded (the spec's reserved expansion), so a capture never gains a `/` the client did not send.

use prost::Message as _;
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, MethodDescriptor, Value,
};

use crate::fields::{find_field, parse_query, set_path, BytesText};
use crate::proto::{bundled_pool, ProtoSet};
use crate::transcode::{
    encode_message, fill_params, json_to_message, HttpRequest, RequestError, TranscodeConfig,
    Transcoder, HTTP_BODY,
};

/// A parsed path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTemplate {
    segments: Vec<Segment>,
    vars: Vec<Variable>,
    verb: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `*`: exactly one non-empty segment.
    One,
    /// `**`: the rest of the path, zero or more segments.
    Rest,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Variable {
    field_path: String,
    start: usize,
    end: usize,
}

/// Longest template accepted, a bound against hostile descriptors.
const MAX_TEMPLATE: usize = 4096;

impl PathTemplate {
    pub fn parse(template: &str) -> Result<Self, String> {
        if template.len() > MAX_TEMPLATE {
            return Err(format!("path template longer than {MAX_TEMPLATE} bytes"));
        }
        let err = |what: &str| format!("invalid path template \"{template}\": {what}");
        let rest = template
            .strip_prefix('/')
            .ok_or_else(|| err("must start with '/'"))?;
        let mut p = Parser {
            s: rest.as_bytes(),
            i: 0,
            segments: Vec::new(),
            vars: Vec::new(),
        };
        p.segments(false).map_err(|e| err(&e))?;
        let verb = if p.peek() == Some(b':') {
            p.i += 1;
            let lit = p.literal();
            if lit.is_empty() {
                return Err(err("empty verb"));
            }
            Some(lit.to_owned())
        } else {
            None
        };
        if p.i != p.s.len() {
            return Err(err(&format!("unexpected '{}'", p.s[p.i] as char)));
        }
        if let Some(pos) = p.segments.iter().position(|s| *s == Segment::Rest) {
            if pos + 1 != p.segments.len() {
                return Err(err("'**' must be the last segment"));
            }
        }
        for (i, v) in p.vars.iter().enumerate() {
            if p.vars[..i].iter().any(|o| o.field_path == v.field_path) {
                return Err(err(&format!("field \"{}\" captured twice", v.field_path)));
            }
        }
        Ok(PathTemplate {
            segments: p.segments,
            vars: p.vars,
            verb,
        })
    }

    /// The field paths this template captures.
    pub fn variables(&self) -> impl Iterator<Item = &str> {
        self.vars.iter().map(|v| v.field_path.as_str())
    }

    fn literal_count(&self) -> usize {
        self.segments
            .iter()
            .filter(|s| matches!(s, Segment::Literal(_)))
            .count()
    }

    /// Matches a request path (no query string). Returns the captures as `(field_path, decoded value)`.
    pub fn matches(&self, path: &str) -> Option<Vec<(String, String)>> {
        let mut rest = path.strip_prefix('/')?;
        if let Some(verb) = &self.verb {
            let last_start = rest.rfind('/').map_or(0, |i| i + 1);
            let colon = last_start + rest[last_start..].rfind(':')?;
            if &rest[colon + 1..] != verb {
                return None;
            }
            rest = &rest[..colon];
        }
        let parts: Vec<&str> = rest.split('/').collect();
        let has_rest = self.segments.last() == Some(&Segment::Rest);
        let fixed = self.segments.len() - usize::from(has_rest);
        if parts.len() < fixed || (!has_rest && parts.len() != fixed) {
            return None;
        }
        for (seg, part) in self.segments.iter().zip(&parts) {
            match seg {
                Segment::Literal(l) if l != part => return None,
                Segment::One if part.is_empty() => return None,
                _ => {}
            }
        }
        let mut captures = Vec::with_capacity(self.vars.len());
        for v in &self.vars {
            let end = if v.end == self.segments.len() && has_rest {
                parts.len()
            } else {
                v.end
            };
            let raw = parts[v.start..end].join("/");
            let value = if end - v.start == 1 && self.segments[v.start] != Segment::Rest {
                percent_encoding::percent_decode_str(&raw)
                    .decode_utf8()
                    .ok()?
                    .into_owned()
            } else {
                decode_keeping_slash(&raw)?
            };
            captures.push((v.field_path.clone(), value));
        }
        Some(captures)
    }
}

fn decode_keeping_slash(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    for (i, piece) in raw.split("%2F").enumerate() {
        for (j, p) in piece.split("%2f").enumerate() {
            if i > 0 && j == 0 {
                out.push_str("%2F");
            } else if j > 0 {
                out.push_str("%2f");
            }
            out.push_str(&percent_encoding::percent_decode_str(p).decode_utf8().ok()?);
        }
    }
    Some(out)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    segments: Vec<Segment>,
    vars: Vec<Variable>,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn literal(&mut self) -> &'a str {
        let start = self.i;
        while let Some(c) = self.peek() {
            if matches!(c, b'/' | b'{' | b'}' | b'*' | b'=' | b':' | b'?' | b'#')
                || c.is_ascii_control()
                || c == b' '
            {
                break;
            }
            self.i += 1;
        }
        std::str::from_utf8(&self.s[start..self.i]).expect("template is a str")
    }

    fn segments(&mut self, in_var: bool) -> Result<(), String> {
        loop {
            self.segment(in_var)?;
            if self.peek() == Some(b'/') {
                self.i += 1;
            } else {
                return Ok(());
            }
        }
    }

    fn segment(&mut self, in_var: bool) -> Result<(), String> {
        match self.peek() {
            Some(b'*') => {
                self.i += 1;
                if self.peek() == Some(b'*') {
                    self.i += 1;
                    self.segments.push(Segment::Rest);
                } else {
                    self.segments.push(Segment::One);
                }
            }
            Some(b'{') => {
                if in_var {
                    return Err("nested variable".into());
                }
                self.i += 1;
                let start = self.i;
                while let Some(c) = self.peek() {
                    if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' {
                        self.i += 1;
                    } else {
                        break;
                    }
                }
                let path = std::str::from_utf8(&self.s[start..self.i]).expect("ascii");
                if path.is_empty()
                    || path
                        .split('.')
                        .any(|p| p.is_empty() || p.as_bytes()[0].is_ascii_digit())
                {
                    return Err(format!("bad field path \"{path}\""));
                }
                let first = self.segments.len();
                if self.peek() == Some(b'=') {
                    self.i += 1;
                    self.segments(true)?;
                } else {
                    self.segments.push(Segment::One);
                }
                if self.peek() != Some(b'}') {
                    return Err("unclosed variable".into());
                }
                self.i += 1;
                self.vars.push(Variable {
                    field_path: path.to_owned(),
                    start: first,
                    end: self.segments.len(),
                });
            }
            _ => {
                let lit = self.literal();
                if lit.is_empty() {
                    return Err("empty segment".into());
                }
                self.segments.push(Segment::Literal(lit.to_owned()));
            }
        }
        Ok(())
    }
}

/// What the request body maps to.
#[derive(Debug, Clone)]
enum BodyRule {
    /// No body: the body is ignored, every non-path field comes from the query.
    None,
    /// `body: "*"`: the whole message; the query is not used.
    All,
    /// `body: "field"`: that top-level field.
    Field(FieldDescriptor),
}

/// One HTTP binding of a method.
#[derive(Debug, Clone)]
pub struct HttpBinding {
    http_method: String,
    template: PathTemplate,
    body: BodyRule,
    transcoder: Transcoder,
}

impl HttpBinding {
    /// The method's transcoder: upstream path, `grpc-timeout`, response transcoding (with `response_body`).
    pub fn transcoder(&self) -> &Transcoder {
        &self.transcoder
    }

    pub fn http_method(&self) -> &str {
        &self.http_method
    }

    pub fn template(&self) -> &PathTemplate {
        &self.template
    }

    /// Builds the request message and appends its gRPC frame to `out`: the body per the rule's `body`, then the
    /// path captures, then (unless `body: "*"`) query parameters into the fields neither of them bound. Unknown
    /// query parameters are ignored. `req.params` (route parameters) are applied last.
    pub fn encode_request(
        &self,
        captures: &[(String, String)],
        req: &HttpRequest<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), RequestError> {
        let desc = self.transcoder.method().input();
        let mut msg = match &self.body {
            BodyRule::None => DynamicMessage::new(desc),
            BodyRule::All => {
                if desc.full_name() == HTTP_BODY {
                    raw_http_body(desc, req)
                } else if req.body.is_empty() {
                    DynamicMessage::new(desc)
                } else {
                    json_to_message(desc, req.body)?
                }
            }
            BodyRule::Field(field) => {
                let mut msg = DynamicMessage::new(desc);
                if !req.body.is_empty() {
                    set_body_field(&mut msg, field, req)?;
                }
                msg
            }
        };
        for (path, value) in captures {
            set_path(&mut msg, path, Some(value), BytesText::Base64).map_err(RequestError)?;
        }
        if !matches!(self.body, BodyRule::All) {
            let body_field = match &self.body {
                BodyRule::Field(f) => Some(f.name()),
                _ => None,
            };
            for (k, v) in parse_query(req.query).map_err(RequestError)? {
                let top = k.split('.').next().unwrap_or("");
                let top_name = find_field(&msg.descriptor(), top).map(|f| f.name().to_owned());
                if top_name.is_none() || top_name.as_deref() == body_field {
                    continue;
                }
                if captures.iter().any(|(p, _)| same_or_prefix(p, &k)) {
                    continue;
                }
                set_path(&mut msg, &k, v.as_deref(), BytesText::Base64).map_err(RequestError)?;
            }
        }
        fill_params(&mut msg, req.params)?;
        encode_message(&msg, out);
        Ok(())
    }
}

use prost_reflect::ReflectMessage as _;

fn same_or_prefix(a: &str, b: &str) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    long == short || (long.starts_with(short) && long.as_bytes()[short.len()] == b'.')
}

fn raw_http_body(desc: MessageDescriptor, req: &HttpRequest<'_>) -> DynamicMessage {
    let mut m = DynamicMessage::new(desc);
    m.set_field_by_name(
        "content_type",
        Value::String(req.content_type.unwrap_or("").to_owned()),
    );
    m.set_field_by_name(
        "data",
        Value::Bytes(bytes::Bytes::copy_from_slice(req.body)),
    );
    m
}

fn set_body_field(
    msg: &mut DynamicMessage,
    field: &FieldDescriptor,
    req: &HttpRequest<'_>,
) -> Result<(), RequestError> {
    match field.kind() {
        Kind::Message(m) if !field.is_list() && !field.is_map() => {
            let value = if m.full_name() == HTTP_BODY {
                raw_http_body(m, req)
            } else {
                json_to_message(m, req.body)?
            };
            msg.set_field(field, Value::Message(value));
        }
        _ => {
            // A scalar, list or map field: wrap the parsed body under the field's name (never by splicing bytes,
            // which would let a body inject sibling fields).
            let v: serde_json::Value = serde_json::from_slice(req.body).map_err(|e| {
                RequestError(format!("failed to encode request data to protobuf: {e}"))
            })?;
            let mut obj = serde_json::Map::new();
            obj.insert(field.name().to_owned(), v);
            let wrapped = serde_json::to_vec(&serde_json::Value::Object(obj))
                .expect("writing to a Vec cannot fail");
            let parsed = json_to_message(msg.descriptor(), &wrapped)?;
            msg.set_field(field, parsed.get_field(field).into_owned());
        }
    }
    Ok(())
}

/// The matched binding and its path captures.
#[derive(Debug)]
pub struct HttpMatch<'r> {
    pub binding: &'r HttpBinding,
    pub captures: Vec<(String, String)>,
}

/// Every `google.api.http` binding of a proto, matched against requests.
#[derive(Debug, Clone, Default)]
pub struct HttpRouter {
    bindings: Vec<HttpBinding>,
}

impl HttpRouter {
    /// Collects the bindings of every method of `services` (all services if empty), including
    /// `additional_bindings`. With `auto_mapping`, methods without annotations are bound to
    /// `POST /{package.Service}/{Method}` with `body: "*"` (Envoy's `auto_mapping`). Client-streaming methods are
    /// refused: a request body is one message. A bad template, or a `body`/`response_body`/path field the message
    /// lacks, is an error naming the method.
    pub fn new(
        proto: &ProtoSet,
        services: &[&str],
        auto_mapping: bool,
        config: &TranscodeConfig,
    ) -> Result<Self, String> {
        let mut bindings = Vec::new();
        for s in proto.pool().services() {
            if !services.is_empty() && !services.contains(&s.full_name()) {
                continue;
            }
            for m in s.methods() {
                let rules = http_rules(&m);
                if rules.is_empty() {
                    if auto_mapping && !m.is_client_streaming() {
                        let path = format!("/{}/{}", s.full_name(), m.name());
                        let template = PathTemplate {
                            segments: vec![
                                Segment::Literal(s.full_name().to_owned()),
                                Segment::Literal(m.name().to_owned()),
                            ],
                            vars: Vec::new(),
                            verb: None,
                        };
                        debug_assert!(template.matches(&path).is_some());
                        bindings.push(HttpBinding {
                            http_method: "POST".into(),
                            template,
                            body: BodyRule::All,
                            transcoder: Transcoder::for_method(m.clone(), config),
                        });
                    }
                    continue;
                }
                if m.is_client_streaming() {
                    return Err(format!(
                        "{}: client-streaming methods cannot be bound to HTTP",
                        m.full_name()
                    ));
                }
                for rule in rules {
                    bindings.push(
                        binding(&m, &rule, config)
                            .map_err(|e| format!("{}: {e}", m.full_name()))?,
                    );
                }
            }
        }
        Ok(HttpRouter { bindings })
    }

    pub fn bindings(&self) -> &[HttpBinding] {
        &self.bindings
    }

    /// The binding for `method` + `path` (no query string). Several matching: the one with the most literal
    /// segments, then the one declared first.
    pub fn find(&self, method: &str, path: &str) -> Option<HttpMatch<'_>> {
        let mut best: Option<(usize, HttpMatch<'_>)> = None;
        for b in &self.bindings {
            if b.http_method != method && b.http_method != "*" {
                continue;
            }
            let score = b.template.literal_count();
            if best.as_ref().is_some_and(|(s, _)| *s >= score) {
                continue;
            }
            if let Some(captures) = b.template.matches(path) {
                best = Some((
                    score,
                    HttpMatch {
                        binding: b,
                        captures,
                    },
                ));
            }
        }
        best.map(|(_, m)| m)
    }
}

struct Rule {
    method: String,
    path: String,
    body: String,
    response_body: String,
}

/// The method's `google.api.http` rule and its `additional_bindings`. The options are re-read against the bundled
/// annotations so a descriptor set built without `google/api/annotations.proto` still yields them.
fn http_rules(m: &MethodDescriptor) -> Vec<Rule> {
    let bundled = bundled_pool();
    let (Some(opts_desc), Some(ext)) = (
        bundled.get_message_by_name("google.protobuf.MethodOptions"),
        bundled.get_extension_by_name("google.api.http"),
    ) else {
        return Vec::new();
    };
    let raw = m.options().encode_to_vec();
    let Ok(opts) = DynamicMessage::decode(opts_desc, raw.as_slice()) else {
        return Vec::new();
    };
    if !opts.has_extension(&ext) {
        return Vec::new();
    }
    let rule = opts.get_extension(&ext);
    let Some(rule) = rule.as_message() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    push_rule(rule, &mut out, 0);
    out
}

fn push_rule(rule: &DynamicMessage, out: &mut Vec<Rule>, depth: usize) {
    let s = |name: &str| {
        rule.get_field_by_name(name)
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    let mut method_path = None;
    for verb in ["get", "put", "post", "delete", "patch"] {
        if rule.has_field_by_name(verb) {
            method_path = Some((verb.to_ascii_uppercase(), s(verb)));
        }
    }
    if rule.has_field_by_name("custom") {
        if let Some(c) = rule.get_field_by_name("custom") {
            if let Some(c) = c.as_message() {
                let kind = c
                    .get_field_by_name("kind")
                    .and_then(|v| v.as_str().map(str::to_owned));
                let path = c
                    .get_field_by_name("path")
                    .and_then(|v| v.as_str().map(str::to_owned));
                if let (Some(k), Some(p)) = (kind, path) {
                    method_path = Some((k, p));
                }
            }
        }
    }
    if let Some((method, path)) = method_path {
        out.push(Rule {
            method,
            path,
            body: s("body"),
            response_body: s("response_body"),
        });
    }
    // additional_bindings may not nest further (the spec); one level is read.
    if depth == 0 {
        if let Some(list) = rule.get_field_by_name("additional_bindings") {
            for b in list.as_list().unwrap_or(&[]) {
                if let Some(b) = b.as_message() {
                    push_rule(b, out, 1);
                }
            }
        }
    }
}

fn binding(
    m: &MethodDescriptor,
    rule: &Rule,
    config: &TranscodeConfig,
) -> Result<HttpBinding, String> {
    let template = PathTemplate::parse(&rule.path)?;
    let input = m.input();
    for var in template.variables() {
        check_path(&input, var)?;
    }
    let body = match rule.body.as_str() {
        "" => BodyRule::None,
        "*" => BodyRule::All,
        name => BodyRule::Field(input.get_field_by_name(name).ok_or_else(|| {
            format!(
                "body field \"{name}\" is not a field of {}",
                input.full_name()
            )
        })?),
    };
    let response_body = match rule.response_body.as_str() {
        "" => None,
        name => Some(m.output().get_field_by_name(name).ok_or_else(|| {
            format!(
                "response_body field \"{name}\" is not a field of {}",
                m.output().full_name()
            )
        })?),
    };
    Ok(HttpBinding {
        http_method: rule.method.clone(),
        template,
        body,
        transcoder: Transcoder::for_method(m.clone(), config).with_response_body(response_body),
    })
}

fn check_path(desc: &MessageDescriptor, path: &str) -> Result<(), String> {
    let mut desc = desc.clone();
    let mut parts = path.split('.').peekable();
    while let Some(p) = parts.next() {
        let f = desc.get_field_by_name(p).ok_or_else(|| {
            format!(
                "path field \"{path}\" is not a field of {}",
                desc.full_name()
            )
        })?;
        if f.is_list() || f.is_map() {
            return Err(format!("path field \"{path}\" is repeated"));
        }
        match (f.kind(), parts.peek()) {
            (Kind::Message(m), Some(_)) => desc = m,
            (_, Some(_)) => return Err(format!("path field \"{path}\" goes through a scalar")),
            (_, None) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::compile;
    use crate::status::GrpcStatus;
    use prost_reflect::DynamicMessage;

    fn caps(t: &str, path: &str) -> Option<Vec<(String, String)>> {
        PathTemplate::parse(t).unwrap().matches(path)
    }

    fn c(pairs: &[(&str, &str)]) -> Option<Vec<(String, String)>> {
        Some(
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        )
    }

    #[test]
    fn templates_parse_and_match() {
        assert_eq!(
            caps("/v1/messages/{message_id}", "/v1/messages/123%20x"),
            c(&[("message_id", "123 x")])
        );
        assert_eq!(
            caps(
                "/v1/{name=shelves/*}/books/{book}",
                "/v1/shelves/s1/books/b2"
            ),
            c(&[("name", "shelves/s1"), ("book", "b2")])
        );
        assert_eq!(
            caps("/v1/{name=shelves/*}/books/{book}", "/v1/shelves/s1/books"),
            None
        );
        assert_eq!(
            caps("/v1/{name=**}", "/v1/a/b%2Fc/d%20e"),
            c(&[("name", "a/b%2Fc/d e")])
        );
        // `**` matches zero segments too.
        assert_eq!(caps("/v1/{name=**}", "/v1"), c(&[("name", "")]));
        assert_eq!(caps("/v1/**", "/v1/"), c(&[]));
        assert_eq!(
            caps("/v1/{a.b.c}:cancel", "/v1/x:cancel"),
            c(&[("a.b.c", "x")])
        );
        assert_eq!(caps("/v1/{a}:cancel", "/v1/x:undo"), None);
        assert_eq!(caps("/v1/{a}:cancel", "/v1/x"), None);
        assert_eq!(caps("/v1/*", "/v1/"), None);
        assert_eq!(caps("/v1/{id}", "/v1/%2F"), c(&[("id", "/")]));
        assert_eq!(caps("/v1/{id}", "/v1/%ff"), None);
        assert_eq!(caps("/v1/x", "v1/x"), None);
    }

    #[test]
    fn bad_templates_are_refused() {
        for t in [
            "v1/x",
            "/",
            "/v1//x",
            "/v1/{",
            "/v1/{a",
            "/v1/{a=}",
            "/v1/{}",
            "/v1/{a={b}}",
            "/v1/**/x",
            "/v1/x:",
            "/v1/{1a}",
            "/v1/{a}/{a}",
            "/v1/{a.}",
            "/v1/x}",
            "/v1/x?y",
        ] {
            assert!(PathTemplate::parse(t).is_err(), "{t}");
        }
        assert!(PathTemplate::parse(&format!("/{}", "a".repeat(5000))).is_err());
    }

    const LIB: &str = r#"
        syntax = "proto3";
        package lib;
        import "google/api/annotations.proto";
        import "google/api/httpbody.proto";
        service Library {
          rpc GetBook (GetBookRequest) returns (Book) {
            option (google.api.http) = {
              get: "/v1/{name=shelves/*/books/*}"
              additional_bindings { get: "/v1/books/{name}" }
            };
          }
          rpc CreateBook (CreateBookRequest) returns (Book) {
            option (google.api.http) = { post: "/v1/{parent=shelves/*}/books" body: "book" };
          }
          rpc UpdateBook (Book) returns (Book) {
            option (google.api.http) = { patch: "/v1/{name=shelves/*/books/*}" body: "*" response_body: "title" };
          }
          rpc Search (SearchRequest) returns (SearchReply) {
            option (google.api.http) = { get: "/v1/search" response_body: "hits" };
          }
          rpc Cancel (GetBookRequest) returns (Book) {
            option (google.api.http) = { custom: { kind: "HEAD" path: "/v1/{name}:cancel" } };
          }
          rpc Special (GetBookRequest) returns (Book) {
            option (google.api.http) = { get: "/v1/books/special" };
          }
          rpc Upload (google.api.HttpBody) returns (google.api.HttpBody) {
            option (google.api.http) = { post: "/v1/upload" body: "*" };
          }
          rpc Plain (Book) returns (Book) {}
        }
        message GetBookRequest { string name = 1; int32 version = 2; Filter filter = 3; }
        message Filter { repeated string tags = 1; bool deep = 2; }
        message CreateBookRequest { string parent = 1; Book book = 2; string request_id = 3; }
        message Book { string name = 1; string title = 2; int64 pages = 3; }
        message SearchRequest { string q = 1; repeated int32 years = 2; bytes token = 3; }
        message SearchReply { repeated Book hits = 1; int32 total = 2; }
    "#;

    fn router(auto: bool) -> HttpRouter {
        let set = compile("lib.proto", LIB, |_| None).unwrap();
        HttpRouter::new(&set, &[], auto, &TranscodeConfig::default()).unwrap()
    }

    fn call(
        r: &HttpRouter,
        method: &str,
        path_q: &str,
        body: &str,
    ) -> Option<(String, serde_json::Value)> {
        let (path, query) = path_q.split_once('?').unwrap_or((path_q, ""));
        let m = r.find(method, path)?;
        let req = HttpRequest {
            method,
            content_type: Some("application/json"),
            query: query.as_bytes(),
            body: body.as_bytes(),
            params: &[],
        };
        let mut out = Vec::new();
        m.binding
            .encode_request(&m.captures, &req, &mut out)
            .unwrap();
        let msg =
            DynamicMessage::decode(m.binding.transcoder().method().input(), &out[5..]).unwrap();
        let json = serde_json::to_value(&msg).unwrap();
        Some((m.binding.transcoder().method().name().to_owned(), json))
    }

    #[test]
    fn routes_and_fills_fields() {
        let r = router(false);
        assert_eq!(
            call(&r, "GET", "/v1/shelves/1/books/2?version=3&filter.tags=a&filter.tags=b&filter.deep=true&name=ignored&zzz=1", ""),
            Some(("GetBook".into(), serde_json::json!({"name":"shelves/1/books/2","version":3,"filter":{"tags":["a","b"],"deep":true}})))
        );
        assert_eq!(
            call(&r, "GET", "/v1/books/b%201", ""),
            Some(("GetBook".into(), serde_json::json!({"name":"b 1"})))
        );
        // The literal binding wins over the capture.
        assert_eq!(
            call(&r, "GET", "/v1/books/special", "").unwrap().0,
            "Special"
        );
        assert_eq!(
            call(
                &r,
                "POST",
                "/v1/shelves/s/books?request_id=r&book.title=no",
                r#"{"title":"T","pages":"12"}"#
            ),
            Some((
                "CreateBook".into(),
                serde_json::json!({"parent":"shelves/s","book":{"title":"T","pages":"12"},"requestId":"r"})
            ))
        );
        // body "*": whole body, path wins, query ignored.
        assert_eq!(
            call(
                &r,
                "PATCH",
                "/v1/shelves/s/books/b?title=q",
                r#"{"name":"other","title":"T"}"#
            ),
            Some((
                "UpdateBook".into(),
                serde_json::json!({"name":"shelves/s/books/b","title":"T"})
            ))
        );
        assert_eq!(
            call(&r, "GET", "/v1/search?years=1999&years=2000&token=AAE", ""),
            Some((
                "Search".into(),
                serde_json::json!({"years":[1999,2000],"token":"AAE="})
            ))
        );
        assert_eq!(call(&r, "HEAD", "/v1/x:cancel", "").unwrap().0, "Cancel");
        assert!(call(&r, "GET", "/v1/x:cancel", "").is_none());
        assert!(call(&r, "DELETE", "/v1/books/x", "").is_none());
        assert!(call(&r, "POST", "/lib.Library/Plain", "{}").is_none());
        let r = router(true);
        assert_eq!(
            call(&r, "POST", "/lib.Library/Plain", r#"{"title":"x"}"#),
            Some(("Plain".into(), serde_json::json!({"title":"x"})))
        );
    }

    #[test]
    fn bad_values_are_400() {
        let r = router(false);
        for (m, p, b) in [
            ("GET", "/v1/books/x?version=abc", ""),
            ("POST", "/v1/shelves/s/books", r#"{"pages":"x"}"#),
            (
                "POST",
                "/v1/shelves/s/books",
                r#"{"title":"a"},"request_id":"injected"#,
            ),
            ("GET", "/v1/search?token=%21%21", ""),
        ] {
            let (path, query) = p.split_once('?').unwrap_or((p, ""));
            let hit = r.find(m, path).unwrap();
            let req = HttpRequest {
                method: m,
                content_type: Some("application/json"),
                query: query.as_bytes(),
                body: b.as_bytes(),
                params: &[],
            };
            let e = hit
                .binding
                .encode_request(&hit.captures, &req, &mut Vec::new())
                .unwrap_err();
            assert_eq!(e.status(), 400, "{p}");
        }
    }

    #[test]
    fn http_body_in_and_out() {
        let r = router(false);
        let m = r.find("POST", "/v1/upload").unwrap();
        let req = HttpRequest {
            method: "POST",
            content_type: Some("image/png"),
            body: b"\x89PNG",
            ..Default::default()
        };
        let mut out = Vec::new();
        m.binding
            .encode_request(&m.captures, &req, &mut out)
            .unwrap();
        let t = m.binding.transcoder();
        let msg = DynamicMessage::decode(t.method().input(), &out[5..]).unwrap();
        assert_eq!(
            msg.get_field_by_name("content_type").unwrap().as_str(),
            Some("image/png")
        );
        // The reply is the same HttpBody: sent raw with its content type.
        let mut resp = t.unary_response();
        resp.push(&out);
        let r = resp
            .finish(
                200,
                &GrpcStatus {
                    code: Some(b"0"),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(r.content_type.as_deref(), Some("image/png"));
        assert_eq!(r.body, b"\x89PNG");
    }

    #[test]
    fn response_body_selects_a_field() {
        let r = router(false);
        let book = |json: &str| {
            let m = r.find("PATCH", "/v1/shelves/s/books/b").unwrap();
            let t = m.binding.transcoder();
            let mut de = serde_json::Deserializer::from_str(json);
            let msg = DynamicMessage::deserialize(t.method().output(), &mut de).unwrap();
            let mut wire = Vec::new();
            crate::frame::encode_frame(&msg.encode_to_vec(), &mut wire);
            let mut resp = t.unary_response();
            resp.push(&wire);
            resp.finish(200, &GrpcStatus::default()).unwrap().body
        };
        assert_eq!(book(r#"{"title":"T","pages":3}"#), br#""T""#);
        let m = r.find("GET", "/v1/search").unwrap();
        let t = m.binding.transcoder();
        let mut resp = t.unary_response();
        resp.push(b"\x00\x00\x00\x00\x00");
        // An empty repeated response_body is [] (APISIX's common complaint is {}).
        assert_eq!(
            resp.finish(200, &GrpcStatus::default()).unwrap().body,
            b"[]"
        );
    }

    #[test]
    fn config_errors_name_the_method() {
        let bad = |rule: &str| {
            let text = format!(
                r#"syntax = "proto3"; package p; import "google/api/annotations.proto";
                   service S {{ rpc M (R) returns (R) {{ option (google.api.http) = {{ {rule} }}; }} }}
                   message R {{ string a = 1; repeated string l = 2; N n = 3; }} message N {{ int32 x = 1; }}"#
            );
            let set = compile("p.proto", &text, |_| None).unwrap();
            HttpRouter::new(&set, &[], false, &TranscodeConfig::default()).unwrap_err()
        };
        assert!(bad(r#"get: "/v1/{b}""#).contains("p.S.M"));
        assert!(bad(r#"get: "/v1/{l}""#).contains("repeated"));
        assert!(bad(r#"get: "/v1/{a.x}""#).contains("scalar"));
        assert!(bad(r#"get: "/v1/{n.y}""#).contains("n.y"));
        assert!(bad(r#"post: "/v1" body: "zz""#).contains("zz"));
        assert!(bad(r#"post: "/v1" response_body: "zz""#).contains("zz"));
        assert!(bad(r#"get: "v1""#).contains("'/'"));
    }
}
