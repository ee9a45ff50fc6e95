//! openid-connect's bearer tokens: found in the request, verified locally (a configured public key or the
//! provider's JWKS) or at the introspection endpoint, then the scope, audience and claim-schema checks and the
//! headers for the upstream.

use super::*;

impl Inner {
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

/// The bearer token of a request: `Authorization: Bearer x`, else the client's `X-Access-Token`. `Err`: an
/// Authorization header that is not `<scheme> <value>` (APISIX answers 400).
pub(super) fn bearer_token<'a>(ctx: &Ctx<'a>) -> Result<Option<&'a str>, ()> {
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

impl OpenidConnect {
    pub(super) fn bearer(&self, ctx: &mut Ctx<'_>, tok: &str) -> Flow {
        let me = &self.0;
        if me.local {
            let disc = me.provider.cached_discovery();
            let issuers = me.issuers(disc.as_deref());
            let jwks = me.provider.cached_jwks();
            let ready = issuers.is_some() && (me.public_key.is_some() || jwks.is_some());
            if let (true, Some(issuers)) = (ready, issuers) {
                let keys = verified::Keys(
                    jwks.as_ref().map_or(0, |j| Arc::as_ptr(j) as usize),
                    jwks.as_ref().map_or(0, |j| j.1),
                    disc.as_ref().map_or(0, |d| Arc::as_ptr(d) as usize),
                );
                let now = now();
                if let Some(claims) = me.verified.get(tok, keys, now) {
                    return me.admit_bearer(ctx, tok, &claims);
                }
                match me.check_local(tok, issuers, jwks.as_ref().map(|j| &j.0)) {
                    Ok(claims) => {
                        let claims = me.verified.put(tok, claims, keys, now);
                        return me.admit_bearer(ctx, tok, &claims);
                    }
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
}
