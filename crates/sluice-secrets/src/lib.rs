//! The secret fields of APISIX resources, and what Sluice does with them:
//!
//! - **encryption at rest** with APISIX's `apisix.data_encryption` semantics (apisix/core/data_encryption.lua):
//!   AES-CBC with the keyring entry as both key and IV (16 bytes: AES-128, 32 bytes: AES-256), PKCS#7 padding,
//!   standard base64. Encryption uses the first entry; decryption tries every entry in order, and a value no entry
//!   decrypts is used as it is. SSL private keys (`ssls` `key`/`keys`, upstream `tls.client_key`) are encrypted
//!   whenever a keyring is set and only while they are PEM (`---` prefix); plugin fields listed in the plugin's
//!   `encrypt_fields` only with `enable_encrypt_fields`, and so are secret managers' credentials (vault `token`,
//!   aws `secret_access_key`/`session_token`, gcp `auth_config.private_key`), which APISIX stores in clear: Sluice
//!   reads APISIX's clear values as they are, but an APISIX node sharing the etcd would not read those Sluice
//!   wrote.
//! - **redaction** for read-only (viewer) Admin API keys: every field above, and every string of a plugin (or
//!   secret manager) Sluice does not know, since its secret fields are unknown.
//!
//! Which fields are secret is declared, per plugin, next to each plugin ([`SecretFields`]); per resource kind, here.
//! This crate does no IO: the store decrypts when it hands resources to the data plane, the Admin API encrypts
//! before it commits and redacts before it answers.

use std::borrow::Cow;

use aes::cipher::block_padding::Pkcs7;
use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use serde_json::Value;

/// What a viewer sees instead of a secret.
pub const REDACTED: &str = "<redacted>";

/// ngx.encode_base64 writes padded standard base64; decoding accepts it with or without the padding.
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

#[derive(Clone, PartialEq, Eq)]
enum Key {
    Aes128([u8; 16]),
    Aes256([u8; 32]),
}

/// `apisix.data_encryption.keyring`: the first entry encrypts, every entry is tried to decrypt.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Keyring {
    keys: Vec<Key>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        write!(f, "Keyring({} keys)", self.keys.len())
    }
}

impl Keyring {
    /// Refuses an entry that is not 16 or 32 bytes long, as APISIX's CLI schema does at startup.
    pub fn new<S: AsRef<str>>(entries: &[S]) -> Result<Keyring, String> {
        let mut keys = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let b = e.as_ref().as_bytes();
            keys.push(match b.len() {
                16 => Key::Aes128(b.try_into().map_err(|_| "unreachable")?),
                32 => Key::Aes256(b.try_into().map_err(|_| "unreachable")?),
                n => {
                    return Err(format!(
                        "apisix.data_encryption.keyring[{i}]: expected a 16 byte (AES-128) or 32 byte (AES-256) \
                         key, got {n} bytes"
                    ))
                }
            });
        }
        Ok(Keyring { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// base64(AES-CBC(first key, IV = key, PKCS#7)); `None` without a key.
    pub fn encrypt(&self, plain: &str) -> Option<String> {
        let key = self.keys.first()?;
        let msg = plain.as_bytes();
        let mut buf = vec![0u8; (msg.len() / 16 + 1) * 16];
        buf[..msg.len()].copy_from_slice(msg);
        let out = match key {
            Key::Aes128(k) => cbc::Encryptor::<aes::Aes128>::new(k.into(), k.into())
                .encrypt_padded_mut::<Pkcs7>(&mut buf, msg.len()),
            Key::Aes256(k) => {
                let iv: &[u8; 16] = k[..16].try_into().ok()?;
                // APISIX passes the 32-byte key as IV; OpenSSL uses its first 16 bytes.
                cbc::Encryptor::<aes::Aes256>::new(k.into(), iv.into())
                    .encrypt_padded_mut::<Pkcs7>(&mut buf, msg.len())
            }
        }
        .ok()?;
        Some(B64.encode(out))
    }

    /// The first key whose decryption has valid padding and UTF-8 wins; `None` when none does (or the text is not
    /// base64 of whole AES blocks).
    pub fn decrypt(&self, text: &str) -> Option<String> {
        let data = B64.decode(text.trim()).ok()?;
        if data.is_empty() || data.len() % 16 != 0 {
            return None;
        }
        self.keys.iter().find_map(|key| {
            let mut buf = data.clone();
            let plain = match key {
                Key::Aes128(k) => cbc::Decryptor::<aes::Aes128>::new(k.into(), k.into())
                    .decrypt_padded_mut::<Pkcs7>(&mut buf)
                    .ok()?,
                Key::Aes256(k) => {
                    let iv: &[u8; 16] = k[..16].try_into().ok()?;
                    cbc::Decryptor::<aes::Aes256>::new(k.into(), iv.into())
                        .decrypt_padded_mut::<Pkcs7>(&mut buf)
                        .ok()?
                }
            };
            String::from_utf8(plain.to_vec()).ok()
        })
    }
}

/// One plugin's secret fields, as APISIX's plugin schemas declare them in `encrypt_fields`: dotted paths; a path
/// through an array applies to each element; a leaf may be a string, an array of strings or a map of strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretFields {
    /// From the plugin's `schema` (its configuration on routes, services, global rules, plugin configs, groups).
    pub conf: &'static [&'static str],
    /// From its `consumer_schema` (auth plugins' credentials); `None`: a consumer's configuration uses `conf`.
    pub consumer: Option<&'static [&'static str]>,
    /// From its `metadata_schema` (`/apisix/plugin_metadata/{name}`).
    pub metadata: &'static [&'static str],
}

impl SecretFields {
    /// A plugin without secrets.
    pub const NONE: SecretFields = SecretFields {
        conf: &[],
        consumer: None,
        metadata: &[],
    };
}

/// Looks a plugin's declaration up by name; `None`: a plugin this build does not know.
pub type PluginFields = fn(&str) -> Option<&'static SecretFields>;

/// Secret-manager credentials (`/apisix/secrets/{manager}/{id}`, apisix/secret/*.lua). APISIX stores them as
/// given; Sluice encrypts them like plugin fields so no credential is kept in clear.
fn manager_fields(manager: &str) -> Option<&'static [&'static str]> {
    match manager {
        "vault" => Some(&["token"]),
        "aws" => Some(&["secret_access_key", "session_token"]),
        "gcp" => Some(&["auth_config.private_key"]),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A private key: encrypted while PEM, whenever there is a keyring.
    Pem,
    /// A plugin's `encrypt_fields`: encrypted with `enable_encrypt_fields`.
    Plugin,
    /// A secret manager's credential: encrypted with `enable_encrypt_fields` (a Sluice addition).
    Manager,
    /// Unknown secrets: every string inside is redacted.
    Everything,
}

/// The node's `data_encryption` settings plus the plugins' declarations: everything the store and the Admin API
/// need to encrypt, decrypt and redact.
#[derive(Clone)]
pub struct DataEncryption {
    keyring: Keyring,
    encrypt_fields: bool,
    plugins: PluginFields,
}

impl std::fmt::Debug for DataEncryption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataEncryption")
            .field("keyring", &self.keyring)
            .field("encrypt_fields", &self.encrypt_fields)
            .finish()
    }
}

impl Default for DataEncryption {
    fn default() -> Self {
        DataEncryption::none()
    }
}

impl DataEncryption {
    pub fn new(keyring: Keyring, encrypt_fields: bool, plugins: PluginFields) -> DataEncryption {
        DataEncryption {
            keyring,
            encrypt_fields,
            plugins,
        }
    }

    /// No keyring and no plugin declarations: nothing is encrypted, every plugin configuration is redacted.
    pub fn none() -> DataEncryption {
        DataEncryption::new(Keyring::default(), false, |_| None)
    }

    pub fn keyring(&self) -> &Keyring {
        &self.keyring
    }

    /// Encrypts the secret fields of the value stored at `key` (`routes/1`, `consumers/jack/credentials/c1`,
    /// `plugin_metadata/http-logger`, ...), in place, before it is stored.
    pub fn encrypt(&self, key: &str, v: &mut Value) {
        if self.keyring.is_empty() {
            return;
        }
        let (kind, id) = split(key);
        self.each(kind, id, v, &mut |at, path, class| {
            let on = match class {
                Class::Pem => true,
                Class::Plugin | Class::Manager => self.encrypt_fields,
                Class::Everything => false,
            };
            if on {
                leaves(at, path, &mut |s| {
                    if class != Class::Pem || s.starts_with("---") {
                        if let Some(e) = self.keyring.encrypt(s) {
                            *s = e;
                        }
                    }
                });
            }
        });
    }

    /// Decrypts, in place, what [`DataEncryption::encrypt`] encrypted; a value no key decrypts stays as it is.
    pub fn decrypt(&self, key: &str, v: &mut Value) {
        let (kind, id) = split(key);
        self.decrypt_classes(kind, id, v, true);
    }

    /// The value as the data plane must see it: decrypted, and copied only when it may hold an encrypted field.
    pub fn decrypted<'a>(&self, key: &str, v: &'a Value) -> Cow<'a, Value> {
        let (kind, id) = split(key);
        self.decrypted_at(kind, id, v)
    }

    /// As [`DataEncryption::decrypted`] for the key `{kind}/{id}`, without building it.
    pub fn decrypted_at<'a>(&self, kind: &str, id: &str, v: &'a Value) -> Cow<'a, Value> {
        if self.keyring.is_empty() || !self.may_hold_secrets(kind, v) {
            return Cow::Borrowed(v);
        }
        let mut owned = v.clone();
        self.decrypt_classes(kind, id, &mut owned, true);
        Cow::Owned(owned)
    }

    /// What APISIX's Admin API answers a GET with: SSL private keys removed, plugins' `encrypt_fields` (and secret
    /// managers' credentials) decrypted, everything else as stored (an upstream's `tls.client_key` stays encrypted).
    pub fn admin_view(&self, key: &str, v: &mut Value) {
        let (kind, id) = split(key);
        if kind == "ssls" {
            if let Some(o) = v.as_object_mut() {
                o.remove("key");
                o.remove("keys");
            }
        }
        self.decrypt_classes(kind, id, v, false);
    }

    /// Replaces every secret of the value at `key` with [`REDACTED`], encrypted or not.
    pub fn redact(&self, key: &str, v: &mut Value) {
        let (kind, id) = split(key);
        self.each(kind, id, v, &mut |at, path, class| {
            if class == Class::Everything {
                redact_strings(at);
            } else {
                leaves(at, path, &mut |s| *s = REDACTED.to_owned());
            }
        });
    }

    fn decrypt_classes(&self, kind: &str, id: &str, v: &mut Value, pem: bool) {
        if self.keyring.is_empty() {
            return;
        }
        self.each(kind, id, v, &mut |at, path, class| {
            let on = match class {
                Class::Pem => pem,
                Class::Plugin | Class::Manager => self.encrypt_fields,
                Class::Everything => false,
            };
            if on {
                leaves(at, path, &mut |s| {
                    if class != Class::Pem || !s.starts_with("---") {
                        if let Some(d) = self.keyring.decrypt(s) {
                            *s = d;
                        }
                    }
                });
            }
        });
    }

    /// Whether the value has a field `decrypt` would touch (checked by top-level name only), so values without
    /// one, most routes among them, are not copied.
    /// False when the stored JSON text of a `kind` resource cannot hold an encrypted field, judged from the
    /// text alone: every field [`DataEncryption::decrypted_at`] decrypts sits under a `plugins` or a
    /// `client_key` key, except in the kinds that always may. A bulk load decodes 100k routes straight from
    /// their text on that answer instead of through a `Value` each.
    pub fn text_may_hold_secrets(&self, kind: &str, text: &str) -> bool {
        match kind {
            "upstreams" | "routes" | "services" | "stream_routes" | "global_rules"
            | "plugin_configs" | "consumer_groups" | "consumers" => {
                !self.keyring.is_empty()
                    && (text.contains("\"plugins\"") || text.contains("\"client_key\""))
            }
            _ => !self.keyring.is_empty(),
        }
    }

    fn may_hold_secrets(&self, kind: &str, v: &Value) -> bool {
        let has = |o: &Value, path: &str| o.get(path.split('.').next().unwrap_or(path)).is_some();
        let client_key = |u: Option<&Value>| {
            u.and_then(|u| u.get("tls"))
                .is_some_and(|t| t.get("client_key").is_some())
        };
        let plugins = |consumer: bool| {
            v.get("plugins")
                .and_then(Value::as_object)
                .is_some_and(|ps| {
                    ps.iter().any(|(name, conf)| {
                        (self.plugins)(name).is_some_and(|s| {
                            let list = match (consumer, s.consumer) {
                                (true, Some(c)) => c,
                                _ => s.conf,
                            };
                            list.iter().any(|p| has(conf, p))
                        })
                    })
                })
        };
        match kind {
            "ssls" => has(v, "key") || has(v, "keys"),
            "upstreams" => client_key(Some(v)),
            "routes" | "services" | "stream_routes" => {
                client_key(v.get("upstream")) || plugins(false)
            }
            "global_rules" | "plugin_configs" | "consumer_groups" => plugins(false),
            "consumers" => plugins(true),
            "plugin_metadata" | "secrets" => true,
            _ => false,
        }
    }

    /// Calls `f(container, field path, class)` for every secret field the value at `{kind}/{id}` may hold.
    fn each(
        &self,
        kind: &str,
        id: &str,
        v: &mut Value,
        f: &mut dyn FnMut(&mut Value, &str, Class),
    ) {
        match kind {
            "ssls" => {
                f(v, "key", Class::Pem);
                f(v, "keys", Class::Pem);
            }
            "upstreams" => f(v, "tls.client_key", Class::Pem),
            "routes" | "services" | "stream_routes" => {
                if let Some(u) = v.get_mut("upstream") {
                    f(u, "tls.client_key", Class::Pem);
                }
                self.plugins(v, false, f);
            }
            "global_rules" | "plugin_configs" | "consumer_groups" => self.plugins(v, false, f),
            // Consumers and their credentials (`consumers/{user}/credentials/{id}`).
            "consumers" => self.plugins(v, true, f),
            "plugin_metadata" => match (self.plugins)(id) {
                Some(s) => s.metadata.iter().for_each(|p| f(v, p, Class::Plugin)),
                None => f(v, "", Class::Everything),
            },
            "secrets" => match manager_fields(id.split('/').next().unwrap_or("")) {
                Some(list) => list.iter().for_each(|p| f(v, p, Class::Manager)),
                None => f(v, "", Class::Everything),
            },
            _ => {}
        }
    }

    fn plugins(&self, v: &mut Value, consumer: bool, f: &mut dyn FnMut(&mut Value, &str, Class)) {
        let Some(Value::Object(plugins)) = v.get_mut("plugins") else {
            return;
        };
        for (name, conf) in plugins.iter_mut() {
            match (self.plugins)(name) {
                Some(s) => {
                    let list = match (consumer, s.consumer) {
                        (true, Some(c)) => c,
                        _ => s.conf,
                    };
                    list.iter().for_each(|p| f(conf, p, Class::Plugin));
                }
                None => f(conf, "", Class::Everything),
            }
        }
    }
}

/// APISIX's `process_encrypt_field`: walks a dotted path (through arrays at intermediate segments) and applies
/// `op` to a string leaf, each string of an array leaf, or each string value of a map leaf.
/// `routes/1` -> (`routes`, `1`); `consumers/jack/credentials/c1` -> (`consumers`, `jack/credentials/c1`).
fn split(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or((key, ""))
}

fn leaves(v: &mut Value, path: &str, op: &mut dyn FnMut(&mut String)) {
    match path.split_once('.') {
        None => match v.get_mut(path) {
            Some(Value::String(s)) => op(s),
            Some(Value::Array(items)) => items.iter_mut().for_each(|i| {
                if let Value::String(s) = i {
                    op(s)
                }
            }),
            Some(Value::Object(m)) => m.values_mut().for_each(|i| {
                if let Value::String(s) = i {
                    op(s)
                }
            }),
            _ => {}
        },
        Some((seg, rest)) => match v.get_mut(seg) {
            Some(Value::Array(items)) => items.iter_mut().for_each(|i| leaves(i, rest, op)),
            Some(o @ Value::Object(_)) => leaves(o, rest, op),
            _ => {}
        },
    }
}

fn redact_strings(v: &mut Value) {
    match v {
        Value::String(s) => *s = REDACTED.to_owned(),
        Value::Array(a) => a.iter_mut().for_each(redact_strings),
        Value::Object(m) => m.values_mut().for_each(redact_strings),
        _ => {}
    }
}

#[cfg(test)]
mod tests;
