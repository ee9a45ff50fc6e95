//! The snapshot's consumers, compiled once: credential maps for the auth plugins (key -> consumer, username ->
//! password + consumer) and each consumer's own plugin chain (its non-auth plugins), so an auth plugin's lookup
//! is one hash probe and attaching a consumer is two `Arc` clones. A consumer's group plugins are merged into its
//! chain (see `CompileEnv::compile_consumer`).

use std::sync::Arc;

use ahash::AHashMap;
use serde_json::Value;

use crate::{Chain, CompileEnv, Ctx, Flow, Response};

/// One consumer ready for requests.
pub struct ConsumerRt {
    pub consumer: Arc<sluice_model::Consumer>,
    /// Its non-auth plugins, merged into the route's chain once it is identified.
    pub chain: Option<Arc<Chain>>,
    /// The username as a header value, built once (attaching a consumer allocates nothing).
    username: bytes::Bytes,
}

impl ConsumerRt {
    /// Makes this consumer the request's consumer (APISIX `consumer.attach_consumer`).
    pub fn attach(&self, ctx: &mut Ctx<'_>) {
        ctx.consumer = Some(self.consumer.clone());
        ctx.consumer_chain = self.chain.clone();
        ctx.edits.set_headers.push((
            bytes::Bytes::from_static(b"X-Consumer-Username"),
            self.username.clone(),
        ));
    }
}

#[derive(Default)]
pub struct Consumers {
    pub list: Vec<Arc<ConsumerRt>>,
    pub by_name: AHashMap<String, Arc<ConsumerRt>>,
    /// key-auth `key` (its bytes: a header value is looked up without a UTF-8 check) -> consumer.
    pub keys: AHashMap<Box<[u8]>, Arc<ConsumerRt>>,
    /// basic-auth `username` -> (`password`, consumer).
    pub basic: AHashMap<String, (String, Arc<ConsumerRt>)>,
    /// Credentials (APISIX 3.11+ `/consumers/{name}/credentials/{id}`): each one's auth plugins, identifying
    /// its consumer exactly as the consumer's own auth objects do (APISIX's `construct_consumer_data`).
    pub credentials: Vec<(sluice_model::Plugins, Arc<ConsumerRt>)>,
}

fn str_field<'a>(
    conf: &'a Value,
    plugin: &str,
    field: &str,
    user: &str,
) -> Result<&'a str, String> {
    conf.get(field).and_then(Value::as_str).ok_or_else(|| {
        format!("consumer {user}: plugin {plugin}: property \"{field}\" is required and must be a string")
    })
}

/// What an auth plugin does when it cannot identify the consumer (APISIX's auth flow): attach its
/// `anonymous_consumer` when it has one, else answer 401 with `msg`.
pub(crate) fn anonymous_or_reject(
    anonymous: Option<&ConsumerRt>,
    ctx: &mut Ctx<'_>,
    msg: &str,
) -> Flow {
    match anonymous {
        Some(a) => {
            a.attach(ctx);
            Flow::Continue
        }
        None => Flow::Respond(Response::message(401, msg)),
    }
}

impl Consumers {
    /// Resolves an auth plugin's `anonymous_consumer` once, when the plugin compiles.
    pub(crate) fn anonymous(&self, name: Option<&str>) -> Result<Option<Arc<ConsumerRt>>, String> {
        name.map(|n| {
            self.by_name
                .get(n)
                .cloned()
                .ok_or_else(|| format!("anonymous consumer {n} not found"))
        })
        .transpose()
    }

    /// Every `plugin` object that identifies a consumer, with that consumer: the consumers' own first, then
    /// their credentials'.
    pub fn auth_confs<'s>(
        &'s self,
        plugin: &'s str,
    ) -> impl Iterator<Item = (&'s Value, &'s Arc<ConsumerRt>)> + 's {
        let own = self
            .list
            .iter()
            .filter_map(move |rt| rt.consumer.plugins.get(plugin).map(|c| (c, rt)));
        let creds = self
            .credentials
            .iter()
            .filter_map(move |(p, rt)| p.get(plugin).map(|c| (c, rt)));
        own.chain(creds)
    }

    pub(crate) fn compile(env: &CompileEnv<'_>) -> Result<Consumers, String> {
        let mut out = Consumers::default();
        for c in env.consumers {
            let chain = env
                .compile_consumer(c)
                .map_err(|e| format!("consumer {}: {e}", c.username))?;
            let rt = Arc::new(ConsumerRt {
                consumer: Arc::new(c.clone()),
                chain,
                username: bytes::Bytes::from(c.username.clone()),
            });
            out.by_name.insert(c.username.clone(), rt.clone());
            out.list.push(rt);
        }
        for cred in env.credentials {
            // A credential whose consumer is gone identifies nobody (APISIX logs "a wild credential").
            match out.by_name.get(&cred.consumer) {
                Some(rt) => out.credentials.push((cred.plugins.clone(), rt.clone())),
                None => tracing::warn!(
                    consumer = %cred.consumer,
                    credential = %cred.id.0,
                    "credential without its consumer; ignored"
                ),
            }
        }
        let mut keys = AHashMap::new();
        let mut basic = AHashMap::new();
        for (conf, rt) in out.auth_confs("key-auth") {
            let user = &rt.consumer.username;
            let key = str_field(conf, "key-auth", "key", user)?;
            // The Admin API refuses duplicates across consumers; one left anyway (a consumer and its own
            // credential, another writer) resolves as in APISIX: the last loaded wins.
            keys.insert(Box::from(key.as_bytes()), rt.clone());
        }
        for (conf, rt) in out.auth_confs("basic-auth") {
            let user = &rt.consumer.username;
            let name = str_field(conf, "basic-auth", "username", user)?;
            let pass = str_field(conf, "basic-auth", "password", user)?;
            basic.insert(name.to_owned(), (pass.to_owned(), rt.clone()));
        }
        out.keys = keys;
        out.basic = basic;
        Ok(out)
    }
}
