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

mod bearer;
mod conf;
mod flow;
mod provider;
mod session;
#[cfg(test)]
mod tests;
mod token;
mod verified;

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

use bearer::bearer_token;
#[cfg(test)]
use conf::compile_conf;
use conf::{check, compile, schema};
#[cfg(test)]
use flow::default_redirect;

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
    /// Bearer tokens verified locally, by their text.
    verified: verified::Verified,
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
}

/// The plugin instance; its bearer hooks are in [`bearer`], the session flow in [`flow`].
struct OpenidConnect(Arc<Inner>);

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
