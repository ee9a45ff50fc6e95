//! openid-connect (priority 2599, rewrite), as APISIX's `apisix/plugins/openid-connect.lua` on lua-resty-openidc.
//!
//! Two ways in, as in APISIX:
//! - **Bearer** (`bearer_only`, or whenever `introspection_endpoint`, `public_key` or `use_jwks` is set and the
//!   request carries `Authorization: Bearer <token>` or `X-Access-Token`): the token is verified locally
//!   (`public_key`, or `use_jwks` with the provider's JWKS from discovery; signature with `ring`, `exp` required,
//!   `nbf`, `iss` against `claim_validator.issuer.valid_issuers` or the discovered issuer) or by the provider's
//!   introspection endpoint (`active` must be true). Then `required_scopes` (403), `claim_validator.audience`
//!   (403), `claim_schema` (401); the upstream gets `X-Access-Token` (or `Authorization`) and `X-Userinfo`
//!   (base64 JSON of the claims). A missing token under `bearer_only`, or a refused one, answers 401 with
//!   `WWW-Authenticate: Bearer realm="<realm>"[, error="invalid_token", error_description="..."]`.
//! - **Session** (the authorization-code flow): a request without a live session is sent (302) to the provider's
//!   authorization endpoint with `state`, and `nonce` (`use_nonce`) and a PKCE S256 challenge (`use_pkce`); the
//!   pending flow rides in the session cookie. The callback (`redirect_uri`, default `<uri>/.apisix/redirect`)
//!   checks `state`, exchanges the code (`token_endpoint_auth_method` basic or post), verifies the ID token
//!   (JWKS signature, `iss`, `aud` holding `client_id`, `exp`, `iat` within `iat_slack`, `nonce`), fetches
//!   userinfo, seals the session (see [`session`]) and redirects to the original URL. Requests with the session
//!   get `X-Access-Token`, `X-ID-Token`, `X-Userinfo` (and `X-Refresh-Token`, `X-Raw-ID-Token` when asked).
//!   `unauth_action` `deny` answers 401 and `pass` lets the request through; `logout_path` clears the cookie and
//!   redirects to the provider's `end_session_endpoint` (with `id_token_hint`, `post_logout_redirect_uri`).
//!   A callback whose `state` does not match restarts the flow at the original URL (at most 3 times); others
//!   answer 500.
//!
//! The five output headers are always removed from the client's request first, so a client cannot pose as an
//! authenticated user by sending them. Provider calls are awaited IO ([`Ctx::await_io`]); discovery and JWKS are
//! cached per configuration ([`provider`]), so a bearer check or a session request with warm caches does no IO.
//! Secrets (client secret, tokens, session contents) are never logged.
//!
//! An expired session access token is renewed with the refresh token (`renew_access_token_on_expiry`) and the
//! renewed cookie set on the response.
//!
//! Not here (refused when configured): PAR, DPoP, `private_key_jwt` / `client_secret_jwt` client authentication,
//! `proxy_opts`, Redis session storage. Accepted and ignored: the session's idling and rolling timeouts
//! (`absolute_timeout` applies), introspection caching (`introspection_interval`).

mod provider;
mod session;
#[cfg(test)]
mod tests;
mod token;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::jwt_auth::keys::Key;
use crate::jwt_auth::Alg;
use crate::registry::Entry;
use crate::util::{base64_encode, error_page};
use crate::{CompileEnv, Ctx, Flow, Phase, PhaseMask, Plugin, Response, Resume};
use provider::{Discovery, Provider};
use session::{Authed, Pending, Sealer, Session};
use token::{Expect, Jwks, Refused};

pub const NAME: &str = "openid-connect";
pub const PRIORITY: i32 = 2599;

pub(crate) const ENTRY: Entry = Entry {
    name: NAME,
    priority: PRIORITY,
    auth: false,
    schema,
    check,
    compile,
    secrets: sluice_secrets::SecretFields {
        conf: &[
            "client_secret",
            "client_rsa_private_key",
            "dpop.private_key",
            "session.secret",
            "session.redis.password",
        ],
        consumer: None,
        metadata: &[],
    },
};

/// The request headers this plugin sets for the upstream; a client's own are always removed.
const OUTPUTS: [&[u8]; 5] = [
    b"x-access-token",
    b"x-userinfo",
    b"x-id-token",
    b"x-refresh-token",
    b"x-raw-id-token",
];

/// How many times a failed callback sends the browser back to the original URL (APISIX's
/// `MAX_AUTH_FLOW_RESTARTS`).
const MAX_RESTARTS: u8 = 3;

/// RFC 3986 unreserved characters stay; everything else in a query value is percent-encoded.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn schema() -> Value {
    let mut s = json!({
        "type": "object",
        "properties": {
            "client_id": {"type": "string"},
            "client_secret": {"type": "string"},
            "discovery": {"type": "string"},
            "scope": {"type": "string", "default": "openid"},
            "ssl_verify": {"type": "boolean", "default": true},
            "timeout": {"type": "integer", "minimum": 1, "default": 3, "description": "timeout in seconds"},
            "introspection_endpoint": {"type": "string"},
            "introspection_endpoint_auth_method": {"type": "string", "default": "client_secret_basic"},
            "token_endpoint_auth_method": {"type": "string", "default": "client_secret_basic"},
            "bearer_only": {"type": "boolean", "default": false},
            "realm": {"type": "string", "default": "apisix"},
            "claim_validator": {
                "type": "object",
                "properties": {
                    "issuer": {"type": "object", "properties": {
                        "valid_issuers": {"type": "array", "items": {"type": "string"}}}},
                    "audience": {"type": "object", "properties": {
                        "claim": {"type": "string", "default": "aud"},
                        "required": {"type": "boolean", "default": false},
                        "match_with_client_id": {"type": "boolean", "default": false}}}
                }
            },
            "logout_path": {"type": "string", "default": "/logout"},
            "redirect_uri": {"type": "string"},
            "post_logout_redirect_uri": {"type": "string"},
            "unauth_action": {"type": "string", "default": "auth", "enum": ["auth", "deny", "pass"]},
            "public_key": {"type": "string"},
            "use_jwks": {"type": "boolean", "default": false},
            "token_signing_alg_values_expected": {"type": "string"},
            "use_pkce": {"type": "boolean", "default": false},
            "par": {"type": "object"},
            "dpop": {"type": "object"}
        },
        "encrypt_fields": ["client_secret", "client_rsa_private_key", "dpop.private_key",
            "session.secret", "session.redis.password"],
        "required": ["client_id", "discovery"]
    });
    let props = s["properties"].as_object_mut().expect("an object");
    if let Value::Object(more) = more_properties() {
        props.extend(more);
    }
    props.insert("session".into(), session_schema());
    s
}

fn session_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "secret": {"type": "string", "minLength": 16,
                "description": "the key used for the encrypt and HMAC calculation"},
            "cookie_name": {"type": "string"},
            "cookie_path": {"type": "string"},
            "cookie_domain": {"type": "string"},
            "cookie_secure": {"type": "boolean"},
            "cookie_http_only": {"type": "boolean"},
            "cookie_same_site": {"type": "string", "enum": ["Strict", "Lax", "None", "Default"]},
            "idling_timeout": {"type": "integer"},
            "rolling_timeout": {"type": "integer"},
            "absolute_timeout": {"type": "integer"},
            "cookie": {"type": "object", "properties": {"lifetime": {"type": "integer"}}},
            "storage": {"type": "string", "enum": ["cookie", "redis"], "default": "cookie"},
            "redis": {"type": "object"}
        },
        "required": ["secret"],
        "additionalProperties": false
    })
}

fn more_properties() -> Value {
    json!({
            "set_access_token_header": {"type": "boolean", "default": true},
            "access_token_in_authorization_header": {"type": "boolean", "default": false},
            "set_id_token_header": {"type": "boolean", "default": true},
            "set_raw_id_token_header": {"type": "boolean", "default": false},
            "set_userinfo_header": {"type": "boolean", "default": true},
            "set_refresh_token_header": {"type": "boolean", "default": false},
            "proxy_opts": {"type": "object"},
            "authorization_params": {"type": "object"},
            "client_rsa_private_key": {"type": "string"},
            "client_rsa_private_key_id": {"type": "string"},
            "client_jwt_assertion_expires_in": {"type": "integer", "default": 60},
            "client_jwt_assertion_alg": {"type": "string",
                "enum": ["HS256", "HS512", "RS256", "RS512", "ES256", "ES512"]},
            "client_jwt_assertion_audience": {"type": "string"},
            "renew_access_token_on_expiry": {"type": "boolean", "default": true},
            "access_token_expires_in": {"type": "integer"},
            "refresh_session_interval": {"type": "integer"},
            "iat_slack": {"type": "integer", "default": 120},
            "accept_none_alg": {"type": "boolean", "default": false},
            "accept_unsupported_alg": {"type": "boolean", "default": true},
            "access_token_expires_leeway": {"type": "integer", "default": 0},
            "force_reauthorize": {"type": "boolean", "default": false},
            "use_nonce": {"type": "boolean", "default": false},
            "revoke_tokens_on_logout": {"type": "boolean", "default": false},
            "jwk_expires_in": {"type": "integer", "default": 86400},
            "jwt_verification_cache_ignore": {"type": "boolean", "default": false},
            "cache_segment": {"type": "string"},
            "introspection_interval": {"type": "integer", "default": 0},
            "introspection_expiry_claim": {"type": "string"},
            "introspection_addon_headers": {"type": "array", "minItems": 1,
                "items": {"type": "string", "pattern": "^[^:]+$"}},
            "required_scopes": {"type": "array", "items": {"type": "string"}},
            "claim_schema": {"type": "object"}
    })
}

fn d_scope() -> String {
    "openid".into()
}
fn yes() -> bool {
    true
}
fn d_timeout() -> u64 {
    3
}
fn d_basic() -> String {
    "client_secret_basic".into()
}
fn d_realm() -> String {
    "apisix".into()
}
fn d_logout() -> String {
    "/logout".into()
}
fn d_auth() -> String {
    "auth".into()
}
fn d_iat_slack() -> i64 {
    120
}
fn d_jwk_ttl() -> i64 {
    86400
}
fn d_aud() -> String {
    "aud".into()
}

#[derive(Deserialize, Default)]
struct SessionConf {
    secret: String,
    cookie_name: Option<String>,
    cookie_path: Option<String>,
    cookie_domain: Option<String>,
    cookie_secure: Option<bool>,
    cookie_http_only: Option<bool>,
    cookie_same_site: Option<String>,
    absolute_timeout: Option<i64>,
    cookie: Option<LegacyCookie>,
    storage: Option<String>,
}

#[derive(Deserialize, Default)]
struct LegacyCookie {
    lifetime: Option<i64>,
}

#[derive(Deserialize, Default)]
struct Issuers {
    valid_issuers: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct Audience {
    #[serde(default = "d_aud")]
    claim: String,
    #[serde(default)]
    required: bool,
    #[serde(default)]
    match_with_client_id: bool,
}

#[derive(Deserialize, Default)]
struct ClaimValidator {
    issuer: Option<Issuers>,
    audience: Option<Audience>,
}

#[derive(Deserialize)]
struct Conf {
    client_id: String,
    client_secret: Option<String>,
    discovery: String,
    #[serde(default = "d_scope")]
    scope: String,
    #[serde(default = "yes")]
    ssl_verify: bool,
    #[serde(default = "d_timeout")]
    timeout: u64,
    introspection_endpoint: Option<String>,
    #[serde(default = "d_basic")]
    introspection_endpoint_auth_method: String,
    #[serde(default = "d_basic")]
    token_endpoint_auth_method: String,
    #[serde(default)]
    bearer_only: bool,
    session: Option<SessionConf>,
    #[serde(default = "d_realm")]
    realm: String,
    claim_validator: Option<ClaimValidator>,
    #[serde(default = "d_logout")]
    logout_path: String,
    redirect_uri: Option<String>,
    post_logout_redirect_uri: Option<String>,
    #[serde(default = "d_auth")]
    unauth_action: String,
    public_key: Option<String>,
    #[serde(default)]
    use_jwks: bool,
    token_signing_alg_values_expected: Option<String>,
    #[serde(default)]
    use_pkce: bool,
    par: Option<Value>,
    dpop: Option<Value>,
    #[serde(default = "yes")]
    set_access_token_header: bool,
    #[serde(default)]
    access_token_in_authorization_header: bool,
    #[serde(default = "yes")]
    set_id_token_header: bool,
    #[serde(default)]
    set_raw_id_token_header: bool,
    #[serde(default = "yes")]
    set_userinfo_header: bool,
    #[serde(default)]
    set_refresh_token_header: bool,
    proxy_opts: Option<Value>,
    authorization_params: Option<serde_json::Map<String, Value>>,
    #[serde(default = "d_iat_slack")]
    iat_slack: i64,
    #[serde(default)]
    access_token_expires_leeway: i64,
    #[serde(default)]
    use_nonce: bool,
    #[serde(default = "yes")]
    renew_access_token_on_expiry: bool,
    #[serde(default = "d_jwk_ttl")]
    jwk_expires_in: i64,
    introspection_addon_headers: Option<Vec<String>>,
    required_scopes: Option<Vec<String>>,
    claim_schema: Option<Value>,
}

fn check(v: &Value) -> Result<(), String> {
    compile_conf(v, false).map(drop)
}

fn compile(v: &Value, _env: &CompileEnv<'_>) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(OpenidConnect(Arc::new(compile_conf(v, true)?))))
}

fn client_auth_method(m: &str, what: &str) -> Result<bool, String> {
    match m {
        "client_secret_basic" => Ok(true),
        "client_secret_post" => Ok(false),
        other => Err(format!(
            "{what} {other:?} is not supported by Sluice (client_secret_basic, client_secret_post)"
        )),
    }
}

fn enabled(v: &Option<Value>) -> bool {
    v.as_ref()
        .and_then(|o| o.get("enabled"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn compile_conf(v: &Value, warn: bool) -> Result<Inner, String> {
    // APISIX's check_schema: the session secret comes first, then the client secret's exemptions.
    if v.get("bearer_only").and_then(Value::as_bool) != Some(true) && v.get("session").is_none() {
        return Err("property \"session.secret\" is required when \"bearer_only\" is false".into());
    }
    let mut v = v.clone();
    if v.get("ssl_verify").and_then(Value::as_str) == Some("no") {
        v["ssl_verify"] = Value::Bool(false);
    }
    let c: Conf = crate::util::parse(&schema(), &v)?;
    let secret_optional = if c.bearer_only {
        c.public_key.is_some() || c.use_jwks
    } else {
        c.use_pkce
    };
    if !secret_optional && c.client_secret.is_none() {
        return Err("property \"client_secret\" is required".into());
    }
    for (flat, owner) in [
        ("use_par", "par.enabled"),
        ("pushed_authorization_request_endpoint", "par.endpoint"),
        ("use_dpop", "dpop.enabled"),
        ("dpop_private_key", "dpop.private_key"),
    ] {
        if v.get(flat).is_some() {
            return Err(format!(
                "property \"{flat}\" is not allowed, use \"{owner}\" instead"
            ));
        }
    }
    if enabled(&c.par) {
        return Err("par: Pushed Authorization Requests are not supported by Sluice".into());
    }
    if enabled(&c.dpop) {
        return Err("dpop: DPoP is not supported by Sluice".into());
    }
    if c.proxy_opts.is_some() {
        return Err(
            "proxy_opts: calling the provider through a proxy is not supported by Sluice".into(),
        );
    }
    let token_basic =
        client_auth_method(&c.token_endpoint_auth_method, "token_endpoint_auth_method")?;
    let intro_basic = client_auth_method(
        &c.introspection_endpoint_auth_method,
        "introspection_endpoint_auth_method",
    )?;
    if let Some(s) = &c.claim_schema {
        // The schema must compile (APISIX: "check claim_schema failed").
        if let Err(e) = sluice_model::schema::validate(s, &json!({})) {
            if e.contains("schema") && !e.contains("property") {
                return Err(format!("check claim_schema failed: {e}"));
            }
        }
    }
    let algs = match &c.token_signing_alg_values_expected {
        Some(a) => {
            let alg = Alg::parse(a)
                .filter(|x| token::ASYMMETRIC.contains(x))
                .ok_or_else(|| {
                    format!("token_signing_alg_values_expected: {a:?} is not supported")
                })?;
            vec![alg]
        }
        None => token::ASYMMETRIC.to_vec(),
    };
    let public_key = match &c.public_key {
        Some(pem) => Some(Key::public(pem).map_err(|e| format!("public_key: {e}"))?),
        None => None,
    };
    let timeout = Duration::from_secs(c.timeout);
    let provider = Provider::new(
        &c.discovery,
        c.ssl_verify,
        timeout,
        Duration::from_secs(c.jwk_expires_in.max(0) as u64),
    )?;
    let introspection = match &c.introspection_endpoint {
        Some(u) => Some(
            provider
                .target(u)
                .map_err(|e| format!("introspection_endpoint: {e}"))?,
        ),
        None => None,
    };
    let session = match &c.session {
        Some(s) => {
            if s.storage.as_deref() == Some("redis") {
                return Err("session.storage \"redis\" is not supported by Sluice".into());
            }
            let lifetime = s
                .absolute_timeout
                .or(s.cookie.as_ref().and_then(|c| c.lifetime))
                .unwrap_or(86400)
                .max(1) as u64;
            Some(Sealer::new(
                s.secret.as_bytes(),
                &session::CookieConf {
                    name: s.cookie_name.as_deref().unwrap_or("session"),
                    path: s.cookie_path.as_deref().unwrap_or("/"),
                    domain: s.cookie_domain.as_deref(),
                    secure: s.cookie_secure,
                    http_only: s.cookie_http_only.unwrap_or(true),
                    same_site: s.cookie_same_site.as_deref().unwrap_or("Lax"),
                    lifetime,
                },
            ))
        }
        None => None,
    };
    for (name, value) in [
        ("discovery", Some(&c.discovery)),
        ("introspection_endpoint", c.introspection_endpoint.as_ref()),
        ("redirect_uri", c.redirect_uri.as_ref()),
        (
            "post_logout_redirect_uri",
            c.post_logout_redirect_uri.as_ref(),
        ),
    ] {
        if warn && value.is_some_and(|u| u.to_ascii_lowercase().starts_with("http://")) {
            // APISIX's `core.utils.check_https`: a warning, not an error.
            tracing::warn!(
                plugin = NAME,
                field = name,
                "using {name} with no TLS is a security risk"
            );
        }
    }
    if warn && !c.ssl_verify {
        tracing::warn!(
            plugin = NAME,
            "ssl_verify is false: the provider's certificate is not checked"
        );
    }
    let redirect_path = c.redirect_uri.as_deref().map(|u| path_of(u).to_owned());
    let validator = c.claim_validator.unwrap_or_default();
    let aud = validator.audience;
    let authorization_params = c
        .authorization_params
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            (k, v)
        })
        .collect();
    Ok(Inner {
        client_id: c.client_id,
        client_secret: c.client_secret,
        scope: c.scope,
        realm: c.realm,
        bearer_only: c.bearer_only,
        bearer_mode: c.bearer_only
            || c.introspection_endpoint.is_some()
            || public_key.is_some()
            || c.use_jwks,
        local: public_key.is_some() || c.use_jwks,
        public_key,
        algs,
        introspection,
        intro_basic,
        token_basic,
        redirect_uri: c.redirect_uri,
        redirect_path,
        logout_path: c.logout_path,
        post_logout: c.post_logout_redirect_uri,
        unauth: match c.unauth_action.as_str() {
            "pass" => Unauth::Pass,
            "deny" => Unauth::Deny,
            _ => Unauth::Auth,
        },
        session,
        set_access: c.set_access_token_header,
        access_in_auth: c.access_token_in_authorization_header,
        set_id: c.set_id_token_header,
        set_raw_id: c.set_raw_id_token_header,
        set_userinfo: c.set_userinfo_header,
        set_refresh: c.set_refresh_token_header,
        use_pkce: c.use_pkce,
        use_nonce: c.use_nonce,
        renew: c.renew_access_token_on_expiry,
        required_scopes: c.required_scopes.unwrap_or_default(),
        valid_issuers: validator.issuer.and_then(|i| i.valid_issuers),
        aud_claim: aud.as_ref().map_or_else(d_aud, |a| a.claim.clone()),
        aud_required: aud
            .as_ref()
            .is_some_and(|a| a.required || a.match_with_client_id),
        aud_match_client: aud.as_ref().is_some_and(|a| a.match_with_client_id),
        claim_schema: c.claim_schema,
        iat_slack: c.iat_slack.max(0) as u64,
        access_leeway: c.access_token_expires_leeway.max(0) as u64,
        authorization_params,
        addon_headers: c
            .introspection_addon_headers
            .unwrap_or_default()
            .into_iter()
            .map(|h| (h.to_ascii_lowercase(), h))
            .collect(),
        timeout,
        provider,
    })
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Unauth {
    Auth,
    Deny,
    Pass,
}

struct Inner {
    client_id: String,
    client_secret: Option<String>,
    scope: String,
    realm: String,
    bearer_only: bool,
    /// Bearer tokens are looked for (bearer_only, introspection_endpoint, public_key or use_jwks).
    bearer_mode: bool,
    /// Bearer tokens are verified locally (public_key or use_jwks), not introspected.
    local: bool,
    public_key: Option<Key>,
    algs: Vec<Alg>,
    introspection: Option<client_target::Target>,
    intro_basic: bool,
    token_basic: bool,
    redirect_uri: Option<String>,
    redirect_path: Option<String>,
    logout_path: String,
    post_logout: Option<String>,
    unauth: Unauth,
    session: Option<Sealer>,
    set_access: bool,
    access_in_auth: bool,
    set_id: bool,
    set_raw_id: bool,
    set_userinfo: bool,
    set_refresh: bool,
    use_pkce: bool,
    use_nonce: bool,
    /// renew_access_token_on_expiry: an expired access token is renewed with the refresh token.
    renew: bool,
    required_scopes: Vec<String>,
    valid_issuers: Option<Vec<String>>,
    aud_claim: String,
    aud_required: bool,
    aud_match_client: bool,
    claim_schema: Option<Value>,
    iat_slack: u64,
    access_leeway: u64,
    authorization_params: Vec<(String, String)>,
    /// introspection_addon_headers: (lower-case name to read, name to send).
    addon_headers: Vec<(String, String)>,
    timeout: Duration,
    provider: Provider,
}

mod client_target {
    pub(crate) use crate::forward_auth::client::Target;
}

/// The path of a URL (`https://h/p?q` -> `/p`; a relative `/p?q` -> `/p`).
fn path_of(u: &str) -> &str {
    let rest = match u.find("://") {
        Some(i) => {
            let after = &u[i + 3..];
            match after.find('/') {
                Some(j) => &after[j..],
                None => "/",
            }
        }
        None => u,
    };
    rest.split(['?', '#']).next().unwrap_or("/")
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn enc(s: &str) -> percent_encoding::PercentEncode<'_> {
    utf8_percent_encode(s, QUERY)
}

fn form(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(&enc(k).to_string());
        out.push('=');
        out.push_str(&enc(v).to_string());
    }
    out
}

fn query_arg(ctx: &Ctx<'_>, name: &str) -> Option<String> {
    let raw = ctx.req.arg(name)?;
    let plus = raw.replace('+', " ");
    Some(percent_decode_str(&plus).decode_utf8_lossy().into_owned())
}

fn header(name: &'static [u8], value: impl Into<Bytes>) -> (Bytes, Bytes) {
    (Bytes::from_static(name), value.into())
}

fn redirect(location: &str, cookie: Option<String>) -> Response {
    let mut r = error_page(302);
    r.headers.push(header(b"Location", location.to_owned()));
    if let Some(c) = cookie {
        r.headers.push(header(b"Set-Cookie", c));
    }
    r
}

fn scopes_missing(required: &[String], granted: Option<&str>) -> bool {
    let granted = granted.unwrap_or("");
    required
        .iter()
        .any(|r| !granted.split_ascii_whitespace().any(|g| g == r))
}

fn forbidden(msg: &str) -> Flow {
    let mut r = Response::status(403);
    r.headers.push(header(
        b"Content-Type",
        Bytes::from_static(b"application/json"),
    ));
    r.body = Bytes::from(json!({ "error": msg }).to_string());
    Flow::Respond(r)
}

impl Inner {
    fn client_auth(&self, basic: bool, pairs: &mut Vec<(&'static str, String)>) -> Option<String> {
        let secret = self.client_secret.as_deref().unwrap_or("");
        if basic {
            let cred = format!("{}:{}", enc(&self.client_id), enc(secret));
            Some(format!("Basic {}", base64_encode(cred.as_bytes())))
        } else {
            pairs.push(("client_id", self.client_id.clone()));
            pairs.push(("client_secret", secret.to_owned()));
            None
        }
    }

    /// A 401 for a refused bearer token, with the challenge APISIX sends. Only the token's own faults are
    /// described to the client; why the provider could not be asked is logged.
    fn deny_bearer(&self, err: &BearerErr) -> Flow {
        let err = match err {
            BearerErr::Token(e) => {
                tracing::error!(plugin = NAME, "OIDC introspection failed: {e}");
                *e
            }
            BearerErr::Unavailable(e) => {
                tracing::error!(plugin = NAME, "OIDC introspection failed: {e}");
                "token validation unavailable"
            }
        };
        let mut r = error_page(401);
        let v = format!(
            "Bearer realm=\"{}\", error=\"invalid_token\", error_description=\"{}\"",
            self.realm,
            err.replace(['"', '\\'], "'")
        );
        r.headers.push(header(b"WWW-Authenticate", v));
        Flow::Respond(r)
    }

    fn issuers<'d>(&'d self, disc: Option<&'d Discovery>) -> Option<&'d [String]> {
        match (&self.valid_issuers, disc) {
            (Some(v), _) => Some(v),
            (None, Some(d)) => Some(std::slice::from_ref(&d.issuer)),
            (None, None) => None,
        }
    }

    fn check_local(
        &self,
        tok: &str,
        issuers: &[String],
        jwks: Option<&Jwks>,
    ) -> Result<Value, Refused> {
        token::verify(
            tok,
            jwks,
            self.public_key.as_ref(),
            &Expect {
                algs: &self.algs,
                issuers,
                now: now(),
                leeway: 0,
            },
        )
    }

    /// The audience checks of `claim_validator.audience` and `required_scopes`, then the headers.
    fn admit_bearer(&self, ctx: &mut Ctx<'_>, tok: &str, claims: &Value) -> Flow {
        if !self.required_scopes.is_empty()
            && scopes_missing(
                &self.required_scopes,
                claims.get("scope").and_then(Value::as_str),
            )
        {
            tracing::error!(
                plugin = NAME,
                "OIDC introspection failed: required scopes not present"
            );
            return forbidden(&format!(
                "required scopes {} not present",
                self.required_scopes.join(", ")
            ));
        }
        let aud = claims.get(&self.aud_claim).filter(|v| !v.is_null());
        if self.aud_required && aud.is_none() {
            tracing::error!(
                plugin = NAME,
                "OIDC introspection failed: required audience ({}) not present",
                self.aud_claim
            );
            return forbidden("required audience claim not present");
        }
        if self.aud_match_client {
            let ok = match aud {
                Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(&self.client_id)),
                Some(Value::String(s)) => *s == self.client_id,
                _ => false,
            };
            if !ok {
                tracing::error!(
                    plugin = NAME,
                    "OIDC introspection failed: audience does not match the client id"
                );
                return forbidden("mismatched audience");
            }
        }
        if let Some(s) = &self.claim_schema {
            if let Err(e) = sluice_model::schema::validate(s, claims) {
                tracing::error!(plugin = NAME, "OIDC claim validation failed: {e}");
                let mut r = error_page(401);
                let v = format!(
                    "Bearer realm=\"{}\", error=\"invalid_token\", error_description=\"{}\"",
                    self.realm,
                    e.replace(['"', '\\'], "'")
                );
                r.headers.push(header(b"WWW-Authenticate", v));
                return Flow::Respond(r);
            }
        }
        self.access_header(ctx, tok);
        if self.set_userinfo {
            ctx.edits.set_headers.push(header(
                b"X-Userinfo",
                base64_encode(claims.to_string().as_bytes()),
            ));
        }
        Flow::Continue
    }

    fn access_header(&self, ctx: &mut Ctx<'_>, tok: &str) {
        if !self.set_access {
            return;
        }
        if self.access_in_auth {
            ctx.edits
                .set_headers
                .push(header(b"Authorization", format!("Bearer {tok}")));
        } else {
            ctx.edits
                .set_headers
                .push(header(b"X-Access-Token", tok.to_owned()));
        }
    }

    /// Verifies a bearer token with IO allowed: discovery, keys (fetched again for an unknown `kid`) or
    /// introspection.
    async fn bearer_io(&self, tok: &str, addon: &[(String, String)]) -> Result<Value, BearerErr> {
        if self.local {
            let disc = match &self.valid_issuers {
                Some(_) => None,
                None => Some(self.provider.discovery().await.map_err(|e| {
                    BearerErr::Unavailable(format!("OIDC access discovery url failed: {e}"))
                })?),
            };
            let issuers = self.issuers(disc.as_deref()).unwrap_or_default();
            if self.public_key.is_some() {
                return self
                    .check_local(tok, issuers, None)
                    .map_err(BearerErr::token);
            }
            let keys = self
                .provider
                .jwks(false)
                .await
                .map_err(BearerErr::Unavailable)?;
            match self.check_local(tok, issuers, Some(&keys.0)) {
                Err(Refused::UnknownKid) => {
                    let keys = self
                        .provider
                        .jwks(true)
                        .await
                        .map_err(BearerErr::Unavailable)?;
                    self.check_local(tok, issuers, Some(&keys.0))
                        .map_err(BearerErr::token)
                }
                r => r.map_err(BearerErr::token),
            }
        } else {
            let t = match &self.introspection {
                Some(t) => t,
                None => {
                    let d = self
                        .provider
                        .discovery()
                        .await
                        .map_err(BearerErr::Unavailable)?;
                    let t = d.introspection_endpoint.as_ref().ok_or_else(|| {
                        BearerErr::Unavailable("the provider has no introspection endpoint".into())
                    })?;
                    return self.introspect(t, tok, addon).await;
                }
            };
            self.introspect(t, tok, addon).await
        }
    }

    async fn introspect(
        &self,
        t: &client_target::Target,
        tok: &str,
        addon: &[(String, String)],
    ) -> Result<Value, BearerErr> {
        let mut pairs = vec![
            ("token", tok.to_owned()),
            ("token_type_hint", "access_token".to_owned()),
        ];
        let auth = self.client_auth(self.intro_basic, &mut pairs);
        let body = form(
            &pairs
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        );
        let mut headers: Vec<(&str, &str)> = addon
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        if let Some(a) = &auth {
            headers.push(("Authorization", a));
        }
        let a = self
            .provider
            .call(t, "POST", &headers, Some(body.as_bytes()))
            .await
            .map_err(|e| BearerErr::Unavailable(format!("introspection: {e}")))?;
        let v = a.json().ok_or_else(|| {
            BearerErr::Unavailable(format!("introspection: the provider answered {}", a.status))
        })?;
        if a.status != 200 {
            return Err(BearerErr::Unavailable(format!(
                "introspection: the provider answered {}",
                a.status
            )));
        }
        if v.get("active") != Some(&Value::Bool(true)) {
            return Err(BearerErr::Token("invalid token"));
        }
        Ok(v)
    }

    /// The absolute redirect_uri sent to the provider.
    fn redirect_uri_for(&self, ctx: &Ctx<'_>) -> String {
        let path = match &self.redirect_uri {
            Some(u) if u.contains("://") => return u.clone(),
            Some(u) => u.clone(),
            None => default_redirect(&ctx.req.uri),
        };
        let host = ctx.req.head.host_str().unwrap_or("localhost");
        format!("{}://{host}{path}", ctx.req.scheme)
    }

    fn is_callback(&self, path: &str) -> bool {
        match &self.redirect_path {
            Some(p) => path == p,
            None => path.ends_with("/.apisix/redirect"),
        }
    }

    /// Sets the session's headers on the upstream request (or refuses it for missing scopes).
    fn admit_session(&self, ctx: &mut Ctx<'_>, a: &Authed) -> Flow {
        if !self.required_scopes.is_empty() {
            if a.scope.is_none() {
                tracing::error!(
                    plugin = NAME,
                    "OIDC authentication failed: the scopes granted to the session are unknown"
                );
                return forbidden("required scopes not present");
            }
            if scopes_missing(&self.required_scopes, a.scope.as_deref()) {
                tracing::error!(
                    plugin = NAME,
                    "OIDC authentication failed: required scopes not present"
                );
                return forbidden(&format!(
                    "required scopes {} not present",
                    self.required_scopes.join(", ")
                ));
            }
        }
        if let Some(s) = &self.claim_schema {
            let data =
                json!({"user": a.user, "access_token": a.access_token, "id_token": a.id_token});
            if let Err(e) = sluice_model::schema::validate(s, &data) {
                tracing::error!(plugin = NAME, "OIDC claim validation failed: {e}");
                let mut r = error_page(401);
                let v = format!(
                    "Bearer realm=\"{}\", error=\"invalid_token\", error_description=\"{}\"",
                    self.realm,
                    e.replace(['"', '\\'], "'")
                );
                r.headers.push(header(b"WWW-Authenticate", v));
                return Flow::Respond(r);
            }
        }
        if let Some(t) = &a.access_token {
            self.access_header(ctx, t);
        }
        let e = &mut ctx.edits.set_headers;
        if self.set_id {
            e.push(header(
                b"X-ID-Token",
                base64_encode(a.id_token.to_string().as_bytes()),
            ));
        }
        if let (true, Some(u)) = (self.set_userinfo, &a.user) {
            e.push(header(
                b"X-Userinfo",
                base64_encode(u.to_string().as_bytes()),
            ));
        }
        if let (true, Some(r)) = (self.set_refresh, &a.refresh_token) {
            e.push(header(b"X-Refresh-Token", r.clone()));
        }
        if let (true, Some(r)) = (self.set_raw_id, &a.enc_id_token) {
            e.push(header(b"X-Raw-ID-Token", r.clone()));
        }
        Flow::Continue
    }

    /// The 302 to the authorization endpoint, with a new pending flow in the session cookie.
    fn start_auth(
        &self,
        disc: &Discovery,
        redirect_uri: &str,
        original_url: String,
        restarts: u8,
    ) -> Flow {
        let Some(sealer) = &self.session else {
            return Flow::Respond(error_page(500));
        };
        let Some(endpoint) = &disc.authorization_endpoint else {
            tracing::error!(
                plugin = NAME,
                "OIDC authentication failed: the provider has no authorization_endpoint"
            );
            return Flow::Respond(error_page(500));
        };
        let p = Pending {
            state: session::random_token(),
            nonce: self.use_nonce.then(session::random_token),
            verifier: self.use_pkce.then(session::random_token),
            original_url,
            restarts,
        };
        let mut q: Vec<(&str, String)> = vec![
            ("response_type", "code".into()),
            ("client_id", self.client_id.clone()),
            ("scope", self.scope.clone()),
            ("redirect_uri", redirect_uri.to_owned()),
            ("state", p.state.clone()),
        ];
        if let Some(n) = &p.nonce {
            q.push(("nonce", n.clone()));
        }
        if let Some(v) = &p.verifier {
            q.push(("code_challenge", session::pkce_challenge(v)));
            q.push(("code_challenge_method", "S256".into()));
        }
        for (k, v) in &self.authorization_params {
            q.push((k.as_str(), v.clone()));
        }
        let qs = form(&q.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>());
        let sep = if endpoint.contains('?') { '&' } else { '?' };
        let s = Session {
            exp: now() + sealer.lifetime,
            pending: Some(p),
            authed: None,
        };
        let Some(sealed) = sealer.seal(&s) else {
            return Flow::Respond(error_page(500));
        };
        Flow::Respond(redirect(
            &format!("{endpoint}{sep}{qs}"),
            Some(sealer.set_cookie(&sealed)),
        ))
    }

    fn logout(&self, disc: &Discovery, sess: Option<&Session>) -> Flow {
        let Some(sealer) = &self.session else {
            return Flow::Respond(error_page(500));
        };
        let clear = sealer.clear_cookie();
        let hint = sess
            .and_then(|s| s.authed.as_ref())
            .and_then(|a| a.enc_id_token.as_deref());
        if let Some(end) = &disc.end_session_endpoint {
            let mut q: Vec<(&str, &str)> = Vec::new();
            if let Some(h) = hint {
                q.push(("id_token_hint", h));
            }
            if let Some(p) = &self.post_logout {
                q.push(("post_logout_redirect_uri", p));
                q.push(("client_id", &self.client_id));
            }
            let loc = if q.is_empty() {
                end.clone()
            } else {
                let sep = if end.contains('?') { '&' } else { '?' };
                format!("{end}{sep}{}", form(&q))
            };
            return Flow::Respond(redirect(&loc, Some(clear)));
        }
        if let Some(p) = &self.post_logout {
            return Flow::Respond(redirect(p, Some(clear)));
        }
        let mut r = Response::status(200);
        r.headers
            .push(header(b"Content-Type", Bytes::from_static(b"text/html")));
        r.headers.push(header(b"Set-Cookie", clear));
        r.body = Bytes::from_static(b"<html><body><h2>Logged Out</h2></body></html>");
        Flow::Respond(r)
    }

    /// An ID token's signature and claims (OpenID Connect Core 3.1.3.7).
    async fn verify_id_token(
        &self,
        disc: &Discovery,
        id: &str,
        nonce: Option<&str>,
    ) -> Result<Value, String> {
        let issuers = [disc.issuer.clone()];
        let x = Expect {
            algs: &self.algs,
            issuers: &issuers,
            now: now(),
            leeway: 0,
        };
        let keys = self.provider.jwks(false).await?;
        let claims = match token::verify(id, Some(&keys.0), None, &x) {
            Err(Refused::UnknownKid) => {
                let keys = self.provider.jwks(true).await?;
                token::verify(id, Some(&keys.0), None, &x)
            }
            r => r,
        }
        .map_err(|e| format!("id_token: {}", refused_text(e)))?;
        let aud_ok = match claims.get("aud") {
            Some(Value::String(a)) => *a == self.client_id,
            Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(&self.client_id)),
            _ => false,
        };
        if !aud_ok {
            return Err("id_token: the audience does not hold client_id".into());
        }
        let iat = claims
            .get("iat")
            .and_then(Value::as_u64)
            .ok_or("id_token: no iat")?;
        if iat > now() + self.iat_slack {
            return Err("id_token: issued in the future".into());
        }
        if let Some(n) = nonce {
            if claims.get("nonce").and_then(Value::as_str) != Some(n) {
                return Err("id_token: nonce mismatch".into());
            }
        }
        Ok(claims)
    }

    /// Renews the session's access token with its refresh token; the renewed session and its sealed cookie.
    async fn refresh(&self, mut a: Authed) -> Result<(Authed, String), String> {
        let rt = a.refresh_token.clone().ok_or("no refresh token")?;
        let disc = self.provider.discovery().await?;
        let t = disc
            .token_endpoint
            .as_ref()
            .ok_or("the provider has no token_endpoint")?;
        let mut pairs = vec![
            ("grant_type", "refresh_token".to_owned()),
            ("refresh_token", rt),
        ];
        let auth = self.client_auth(self.token_basic, &mut pairs);
        let body = form(
            &pairs
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        );
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let ans = self
            .provider
            .call(t, "POST", &headers, Some(body.as_bytes()))
            .await
            .map_err(|e| format!("token endpoint (refresh): {e}"))?;
        let v = ans.json().unwrap_or_default();
        if ans.status != 200 {
            let err = v.get("error").and_then(Value::as_str).unwrap_or("");
            return Err(format!(
                "token endpoint (refresh) answered {} {err}",
                ans.status
            ));
        }
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let now = now();
        a.access_token = header_safe(s("access_token"))?;
        if a.access_token.is_none() {
            return Err("the refresh answer has no access_token".into());
        }
        a.access_expires = v.get("expires_in").and_then(Value::as_u64).map(|e| now + e);
        if let Some(r) = header_safe(s("refresh_token"))? {
            a.refresh_token = Some(r);
        }
        if let Some(id) = header_safe(s("id_token"))? {
            a.id_token = self.verify_id_token(&disc, &id, None).await?;
            a.enc_id_token = Some(id);
        }
        if let Some(sc) = s("scope") {
            a.scope = Some(sc);
        }
        let sealer = self.session.as_ref().ok_or("no session")?;
        let sess = Session {
            exp: now + sealer.lifetime,
            pending: None,
            authed: Some(a.clone()),
        };
        let sealed = sealer
            .seal(&sess)
            .ok_or("the session is too large for a cookie")?;
        Ok((a, sealed))
    }

    /// The callback: code exchange, ID token validation, userinfo; the sealed session on success.
    async fn finish(
        &self,
        code: &str,
        pending: &Pending,
        redirect_uri: &str,
    ) -> Result<String, String> {
        let disc = self.provider.discovery().await?;
        let t = disc
            .token_endpoint
            .as_ref()
            .ok_or("the provider has no token_endpoint")?;
        let mut pairs = vec![
            ("grant_type", "authorization_code".to_owned()),
            ("code", code.to_owned()),
            ("redirect_uri", redirect_uri.to_owned()),
        ];
        if let Some(v) = &pending.verifier {
            pairs.push(("code_verifier", v.clone()));
        }
        let auth = self.client_auth(self.token_basic, &mut pairs);
        let body = form(
            &pairs
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
        );
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let a = self
            .provider
            .call(t, "POST", &headers, Some(body.as_bytes()))
            .await
            .map_err(|e| format!("token endpoint: {e}"))?;
        let v = a.json().unwrap_or_default();
        if a.status != 200 {
            let err = v.get("error").and_then(Value::as_str).unwrap_or("");
            return Err(format!("token endpoint answered {} {err}", a.status));
        }
        let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let id = s("id_token").ok_or("the token answer has no id_token")?;
        let claims = self
            .verify_id_token(&disc, &id, pending.nonce.as_deref())
            .await?;
        let access = header_safe(s("access_token"))?;
        let refresh_token = header_safe(s("refresh_token"))?;
        let id = header_safe(Some(id))?.unwrap_or_default();
        let mut user = None;
        if let (Some(u), Some(at)) = (&disc.userinfo_endpoint, &access) {
            let bearer = format!("Bearer {at}");
            match self
                .provider
                .call(u, "GET", &[("Authorization", &bearer)], None)
                .await
            {
                Ok(a) if a.status == 200 => {
                    let info = a.json();
                    // OpenID Connect Core 5.3.2: the userinfo's sub must be the ID token's.
                    if info.as_ref().and_then(|i| i.get("sub")) != claims.get("sub") {
                        return Err("userinfo: sub does not match the id_token's".into());
                    }
                    user = info;
                }
                Ok(a) => tracing::error!(
                    plugin = NAME,
                    "userinfo: the provider answered {}",
                    a.status
                ),
                Err(e) => tracing::error!(plugin = NAME, "userinfo: {e}"),
            }
        }
        let sealer = self.session.as_ref().ok_or("no session")?;
        let now = now();
        let sess = Session {
            exp: now + sealer.lifetime,
            pending: None,
            authed: Some(Authed {
                access_expires: v.get("expires_in").and_then(Value::as_u64).map(|e| now + e),
                access_token: access,
                id_token: claims,
                enc_id_token: Some(id),
                refresh_token,
                user,
                scope: s("scope"),
            }),
        };
        sealer
            .seal(&sess)
            .ok_or_else(|| "the session is too large for a cookie".into())
    }
}

/// Why a bearer token was not admitted.
enum BearerErr {
    /// The token's own fault (told to the client in the challenge).
    Token(&'static str),
    /// The provider could not be asked (logged, not told).
    Unavailable(String),
}

impl BearerErr {
    fn token(r: Refused) -> BearerErr {
        match r {
            Refused::UnknownKid => BearerErr::Token("no key matches the token's kid"),
            Refused::Invalid(e) => BearerErr::Token(e),
        }
    }
}

fn refused_text(r: Refused) -> String {
    match r {
        Refused::UnknownKid => "no key matches the token's kid".into(),
        Refused::Invalid(e) => e.into(),
    }
}

/// A token the provider returned, fit to go into a request header (no spaces or control bytes).
fn header_safe(t: Option<String>) -> Result<Option<String>, String> {
    match t {
        Some(v) if !v.bytes().all(|b| (0x21..0x7f).contains(&b)) => {
            Err("the provider returned a token with bytes that cannot go into a header".into())
        }
        t => Ok(t),
    }
}

/// APISIX's default redirect_uri: the request path with `/.apisix/redirect` appended.
fn default_redirect(uri: &str) -> String {
    const SUFFIX: &str = "/.apisix/redirect";
    if uri.ends_with(SUFFIX) {
        uri.to_owned()
    } else {
        format!("{}{SUFFIX}", uri.strip_suffix('/').unwrap_or(uri))
    }
}

/// The bearer token of a request: `Authorization: Bearer x`, else the client's `X-Access-Token`. `Err`: an
/// Authorization header that is not `<scheme> <value>` (APISIX answers 400).
fn bearer_token<'a>(ctx: &Ctx<'a>) -> Result<Option<&'a str>, ()> {
    let req: &'a crate::ReqView<'a> = ctx.req;
    let Some(h) = req.head.header("authorization") else {
        return Ok(req
            .head
            .header("x-access-token")
            .and_then(|v| std::str::from_utf8(v).ok()));
    };
    let h = std::str::from_utf8(h).map_err(|_| ())?;
    let (scheme, value) = h.split_once(' ').ok_or(())?;
    Ok(scheme.eq_ignore_ascii_case("bearer").then_some(value))
}

struct OpenidConnect(Arc<Inner>);

impl OpenidConnect {
    fn bearer(&self, ctx: &mut Ctx<'_>, tok: &str) -> Flow {
        let me = &self.0;
        if me.local {
            let disc = me.provider.cached_discovery();
            let issuers = me.issuers(disc.as_deref());
            let jwks = me.provider.cached_jwks();
            let ready = issuers.is_some() && (me.public_key.is_some() || jwks.is_some());
            if let (true, Some(issuers)) = (ready, issuers) {
                match me.check_local(tok, issuers, jwks.as_ref().map(|j| &j.0)) {
                    Ok(claims) => return me.admit_bearer(ctx, tok, &claims),
                    Err(Refused::Invalid(e)) => return me.deny_bearer(&BearerErr::Token(e)),
                    // Maybe a new key: ask the provider (below).
                    Err(Refused::UnknownKid) => {}
                }
            }
        }
        let addon: Vec<(String, String)> = me
            .addon_headers
            .iter()
            .filter_map(|(lower, name)| {
                let v = ctx.req.head.header(lower)?;
                Some((name.clone(), String::from_utf8_lossy(v).into_owned()))
            })
            .collect();
        let me = self.0.clone();
        let tok = tok.to_owned();
        let budget = me.timeout * 3 + Duration::from_millis(500);
        let mut on_timeout = error_page(401);
        on_timeout.headers.push(header(
            b"WWW-Authenticate",
            format!(
                "Bearer realm=\"{}\", error=\"invalid_token\", error_description=\"timeout\"",
                me.realm
            ),
        ));
        ctx.await_io(
            async move {
                let r = me.bearer_io(&tok, &addon).await;
                let f: Resume = Box::new(move |ctx: &mut Ctx<'_>| match r {
                    Ok(claims) => me.admit_bearer(ctx, &tok, &claims),
                    Err(e) => me.deny_bearer(&e),
                });
                f
            },
            budget,
            on_timeout,
        );
        Flow::Continue
    }

    /// Runs `f` with the discovery document: at once when cached, else after fetching it.
    fn with_discovery(
        &self,
        ctx: &mut Ctx<'_>,
        fail_status: u16,
        f: impl for<'c> FnOnce(&Inner, &Discovery, &mut Ctx<'c>) -> Flow + 'static,
    ) -> Flow {
        if let Some(d) = self.0.provider.cached_discovery() {
            return f(&self.0, &d, ctx);
        }
        let me = self.0.clone();
        let budget = me.timeout + Duration::from_millis(500);
        ctx.await_io(
            async move {
                let r = me.provider.discovery().await;
                let f: Resume = Box::new(move |ctx: &mut Ctx<'_>| match r {
                    Ok(d) => f(&me, &d, ctx),
                    Err(e) => {
                        tracing::error!(plugin = NAME, "OIDC access discovery url failed: {e}");
                        Flow::Respond(error_page(fail_status))
                    }
                });
                f
            },
            budget,
            error_page(fail_status),
        );
        Flow::Continue
    }

    fn callback(&self, ctx: &mut Ctx<'_>, sess: Option<Session>) -> Flow {
        let me = &self.0;
        let state = query_arg(ctx, "state");
        let code = query_arg(ctx, "code");
        let Some(pending) = sess.as_ref().and_then(|s| s.pending.clone()) else {
            tracing::error!(
                plugin = NAME,
                "OIDC authentication failed: no authorization in progress for this callback"
            );
            return Flow::Respond(error_page(500));
        };
        if state.as_deref() != Some(pending.state.as_str()) {
            let sealer = me.session.as_ref().expect("session flows have a session");
            if pending.restarts < MAX_RESTARTS && ctx.req.head.method_str() == "GET" {
                tracing::warn!(plugin = NAME, "OIDC state mismatch (replayed or pruned callback), restarting the authentication flow");
                let mut s = sess.unwrap_or(Session {
                    exp: 0,
                    pending: None,
                    authed: None,
                });
                let url = pending.original_url.clone();
                s.pending = Some(Pending {
                    restarts: pending.restarts + 1,
                    ..pending
                });
                let cookie = sealer.seal(&s).map(|v| sealer.set_cookie(&v));
                return Flow::Respond(redirect(&url, cookie));
            }
            tracing::error!(plugin = NAME, "OIDC authentication failed: state from argument does not match state restored from session");
            return Flow::Respond(error_page(500));
        }
        let Some(code) = code else {
            let err = query_arg(ctx, "error").unwrap_or_default();
            tracing::error!(
                plugin = NAME,
                "OIDC authentication failed: unhandled request to the redirect_uri (error={err:?})"
            );
            return Flow::Respond(error_page(500));
        };
        let redirect_uri = me.redirect_uri_for(ctx);
        let me = self.0.clone();
        let budget = me.timeout * 5 + Duration::from_millis(500);
        ctx.await_io(
            async move {
                let r = me.finish(&code, &pending, &redirect_uri).await;
                let f: Resume = Box::new(move |_ctx: &mut Ctx<'_>| match r {
                    Ok(sealed) => {
                        let sealer = me.session.as_ref().expect("session flows have a session");
                        Flow::Respond(redirect(
                            &pending.original_url,
                            Some(sealer.set_cookie(&sealed)),
                        ))
                    }
                    Err(e) => {
                        tracing::error!(plugin = NAME, "OIDC authentication failed: {e}");
                        Flow::Respond(error_page(500))
                    }
                });
                f
            },
            budget,
            error_page(500),
        );
        Flow::Continue
    }

    /// An expired access token renewed before the request goes on; the renewed session cookie goes out with the
    /// response. When renewal fails the request is treated as having no session.
    fn renew(&self, ctx: &mut Ctx<'_>, a: Authed) -> Flow {
        let me = self.0.clone();
        let redirect_uri = me.redirect_uri_for(ctx);
        let original = format!(
            "{}://{}{}",
            ctx.req.scheme,
            ctx.req.head.host_str().unwrap_or("localhost"),
            ctx.req.request_uri()
        );
        let budget = me.timeout * 3 + Duration::from_millis(500);
        ctx.await_io(
            async move {
                let r = me.refresh(a).await;
                let f: Resume = Box::new(move |ctx: &mut Ctx<'_>| match r {
                    Ok((a, sealed)) => {
                        let sealer = me.session.as_ref().expect("session flows have a session");
                        ctx.resp
                            .add_headers
                            .push(header(b"Set-Cookie", sealer.set_cookie(&sealed)));
                        me.admit_session(ctx, &a)
                    }
                    Err(e) => {
                        tracing::error!(plugin = NAME, "OIDC access token renewal failed: {e}");
                        match (me.unauth, me.provider.cached_discovery()) {
                            (Unauth::Pass, _) => Flow::Continue,
                            (Unauth::Auth, Some(d)) => {
                                me.start_auth(&d, &redirect_uri, original, 0)
                            }
                            _ => Flow::Respond(error_page(401)),
                        }
                    }
                });
                f
            },
            budget,
            error_page(500),
        );
        Flow::Continue
    }

    fn session_flow(&self, ctx: &mut Ctx<'_>) -> Flow {
        let me = &self.0;
        let Some(sealer) = &me.session else {
            return Flow::Respond(error_page(401));
        };
        let now = now();
        let sess = ctx
            .req
            .cookie(&sealer.name)
            .and_then(|c| sealer.open(c, now));
        if *ctx.req.uri == *me.logout_path {
            return self.with_discovery(ctx, 503, move |me, d, _| me.logout(d, sess.as_ref()));
        }
        if me.is_callback(&ctx.req.uri) {
            return self.callback(ctx, sess);
        }
        if let Some(a) = sess.as_ref().and_then(|s| s.authed.as_ref()) {
            let live = a.access_expires.is_none_or(|e| e > now + me.access_leeway);
            if live {
                return me.admit_session(ctx, a);
            }
            if me.renew && a.refresh_token.is_some() {
                return self.renew(ctx, a.clone());
            }
        }
        let xhr = ctx
            .req
            .head
            .header("x-requested-with")
            .is_some_and(|v| v == b"XMLHttpRequest");
        match me.unauth {
            Unauth::Pass => return Flow::Continue,
            Unauth::Deny => return Flow::Respond(error_page(401)),
            Unauth::Auth if xhr => return Flow::Respond(error_page(401)),
            Unauth::Auth => {}
        }
        let redirect_uri = me.redirect_uri_for(ctx);
        let original = format!(
            "{}://{}{}",
            ctx.req.scheme,
            ctx.req.head.host_str().unwrap_or("localhost"),
            ctx.req.request_uri()
        );
        let restarts = sess
            .as_ref()
            .and_then(|s| s.pending.as_ref())
            .map_or(0, |p| p.restarts);
        self.with_discovery(ctx, 500, move |me, d, _| {
            me.start_auth(d, &redirect_uri, original, restarts)
        })
    }
}

impl Plugin for OpenidConnect {
    fn name(&self) -> &'static str {
        NAME
    }
    fn priority(&self) -> i32 {
        PRIORITY
    }
    fn phases(&self) -> PhaseMask {
        PhaseMask::of(&[Phase::Rewrite])
    }
    fn rewrite(&self, ctx: &mut Ctx<'_>) -> Flow {
        let me = &self.0;
        for h in OUTPUTS {
            ctx.edits.remove_headers.push(Bytes::from_static(h));
        }
        if me.bearer_mode {
            match bearer_token(ctx) {
                Err(()) => return Flow::Respond(error_page(400)),
                Ok(Some(tok)) => return self.bearer(ctx, tok),
                Ok(None) if me.bearer_only => {
                    let mut r = error_page(401);
                    r.headers.push(header(
                        b"WWW-Authenticate",
                        format!("Bearer realm=\"{}\"", me.realm),
                    ));
                    return Flow::Respond(r);
                }
                Ok(None) => {}
            }
        }
        self.session_flow(ctx)
    }
}
