//! jwt-auth's algorithms and keys: the `alg` names APISIX 3.x lists, a consumer's verification key compiled once
//! (HMAC secret, or a PEM public key parsed into the raw form `ring` verifies with), and signature checks with
//! `ring` (no hand-rolled crypto; HMAC keys keep their padded-key state from compile time). A key accepts only the algorithms of its own type (an RSA key RS*/PS*,
//! a P-256 key ES256, ...), which closes the HMAC-with-public-key confusion APISIX's token-chosen `alg` allows.
//! Not here: the token's claims and the plugin itself. ES512 (P-521) is refused: `ring` has no P-521.

use ring::hmac;
use ring::signature::{self as sig, UnparsedPublicKey};

use crate::util::base64_decode;

/// A JWS `alg` APISIX 3.x accepts on a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    HS256,
    HS384,
    HS512,
    RS256,
    RS384,
    RS512,
    ES256,
    ES384,
    ES512,
    PS256,
    PS384,
    PS512,
    EdDSA,
}

const ALL: [Alg; 13] = [
    Alg::HS256,
    Alg::HS384,
    Alg::HS512,
    Alg::RS256,
    Alg::RS384,
    Alg::RS512,
    Alg::ES256,
    Alg::ES384,
    Alg::ES512,
    Alg::PS256,
    Alg::PS384,
    Alg::PS512,
    Alg::EdDSA,
];

impl Alg {
    pub fn parse(s: &str) -> Option<Alg> {
        ALL.into_iter().find(|a| a.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Alg::HS256 => "HS256",
            Alg::HS384 => "HS384",
            Alg::HS512 => "HS512",
            Alg::RS256 => "RS256",
            Alg::RS384 => "RS384",
            Alg::RS512 => "RS512",
            Alg::ES256 => "ES256",
            Alg::ES384 => "ES384",
            Alg::ES512 => "ES512",
            Alg::PS256 => "PS256",
            Alg::PS384 => "PS384",
            Alg::PS512 => "PS512",
            Alg::EdDSA => "EdDSA",
        }
    }

    pub fn is_hmac(self) -> bool {
        matches!(self, Alg::HS256 | Alg::HS384 | Alg::HS512)
    }
}

/// A consumer's verification key, decoded once at compile time.
pub(crate) enum Key {
    /// HS256, HS384, HS512 keys made from the secret once (ring precomputes the inner/outer pads).
    Hmac(Box<[hmac::Key; 3]>),
    /// PKCS#1 `RSAPublicKey` DER.
    Rsa(Vec<u8>),
    /// Uncompressed EC points.
    P256(Vec<u8>),
    P384(Vec<u8>),
    Ed25519(Vec<u8>),
}

const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
const OID_EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
const OID_P521: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x23];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];

/// A minimal DER reader: enough to take a SubjectPublicKeyInfo apart.
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    fn read(&mut self, tag: u8) -> Option<&'a [u8]> {
        let (&t, rest) = self.0.split_first()?;
        let (&l0, rest) = rest.split_first()?;
        if t != tag {
            return None;
        }
        let (len, rest) = if l0 < 0x80 {
            (usize::from(l0), rest)
        } else {
            let n = usize::from(l0 & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |a, b| (a << 8) | usize::from(*b));
            (len, &rest[n..])
        };
        if rest.len() < len {
            return None;
        }
        let (v, tail) = rest.split_at(len);
        self.0 = tail;
        Some(v)
    }
}

/// The DER body of the first PEM block and its label.
fn pem(text: &str) -> Option<(&str, Vec<u8>)> {
    let start = text.find("-----BEGIN ")? + 11;
    let label_end = start + text[start..].find("-----")?;
    let label = &text[start..label_end];
    let body_start = label_end + 5;
    let body_end = body_start + text[body_start..].find("-----END ")?;
    let b64: String = text[body_start..body_end]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    Some((label, base64_decode(&b64)?))
}

/// Bits of an RSAPublicKey's modulus (leading zero octet aside).
fn rsa_bits(pkcs1: &[u8]) -> Option<usize> {
    let mut seq = Der(Der(pkcs1).read(0x30)?);
    let n = seq.read(0x02)?;
    seq.read(0x02)?;
    let n = match n.split_first() {
        Some((0, rest)) => rest,
        _ => n,
    };
    let first = *n.first()?;
    Some(n.len() * 8 - first.leading_zeros() as usize)
}

impl Key {
    /// Parses a PEM public key (`PUBLIC KEY` SubjectPublicKeyInfo, or `RSA PUBLIC KEY` PKCS#1).
    pub(crate) fn public(text: &str) -> Result<Key, String> {
        let bad = || "invalid public key: not a PEM RSA, EC or Ed25519 public key".to_owned();
        let (label, der) = pem(text).ok_or_else(bad)?;
        let key = match label {
            "RSA PUBLIC KEY" => Key::Rsa(der),
            "PUBLIC KEY" => {
                let mut spki = Der(Der(&der).read(0x30).ok_or_else(bad)?);
                let mut alg = Der(spki.read(0x30).ok_or_else(bad)?);
                let bits = spki.read(0x03).ok_or_else(bad)?;
                let bits = match bits.split_first() {
                    Some((0, k)) => k.to_vec(),
                    _ => return Err(bad()),
                };
                let oid = alg.read(0x06).ok_or_else(bad)?;
                if oid == OID_RSA {
                    Key::Rsa(bits)
                } else if oid == OID_ED25519 {
                    Key::Ed25519(bits)
                } else if oid == OID_EC {
                    match alg.read(0x06).ok_or_else(bad)? {
                        c if c == OID_P256 => Key::P256(bits),
                        c if c == OID_P384 => Key::P384(bits),
                        c if c == OID_P521 => {
                            return Err("ES512 (P-521) keys are not supported".into())
                        }
                        _ => return Err("unsupported EC curve".into()),
                    }
                } else {
                    return Err(bad());
                }
            }
            _ => return Err(bad()),
        };
        match &key {
            Key::Rsa(k) => match rsa_bits(k) {
                Some(2048..=8192) => {}
                Some(b) => return Err(format!("RSA key of {b} bits: 2048 to 8192 are supported")),
                None => return Err(bad()),
            },
            Key::P256(p) if p.len() != 65 || p[0] != 4 => return Err(bad()),
            Key::P384(p) if p.len() != 97 || p[0] != 4 => return Err(bad()),
            Key::Ed25519(p) if p.len() != 32 => return Err(bad()),
            _ => {}
        }
        Ok(key)
    }

    /// Whether this key can check `alg` (the consumer's configured algorithm must pass this too).
    pub(crate) fn fits(&self, alg: Alg) -> bool {
        use Alg::*;
        match self {
            Key::Hmac(_) => alg.is_hmac(),
            Key::Rsa(_) => matches!(alg, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
            Key::P256(_) => alg == ES256,
            Key::P384(_) => alg == ES384,
            Key::Ed25519(_) => alg == EdDSA,
        }
    }

    /// Checks `sig` over `signed` with algorithm `alg` (false when `alg` does not fit this key).
    pub(crate) fn verify(&self, alg: Alg, signed: &[u8], signature: &[u8]) -> bool {
        if !self.fits(alg) {
            return false;
        }
        let (vk, raw): (&'static dyn sig::VerificationAlgorithm, &[u8]) = match (self, alg) {
            (Key::Hmac(keys), _) => return hmac_eq(alg, keys, signed, signature),
            (Key::Rsa(k), Alg::RS256) => (&sig::RSA_PKCS1_2048_8192_SHA256, k),
            (Key::Rsa(k), Alg::RS384) => (&sig::RSA_PKCS1_2048_8192_SHA384, k),
            (Key::Rsa(k), Alg::RS512) => (&sig::RSA_PKCS1_2048_8192_SHA512, k),
            (Key::Rsa(k), Alg::PS256) => (&sig::RSA_PSS_2048_8192_SHA256, k),
            (Key::Rsa(k), Alg::PS384) => (&sig::RSA_PSS_2048_8192_SHA384, k),
            (Key::Rsa(k), _) => (&sig::RSA_PSS_2048_8192_SHA512, k),
            (Key::P256(k), _) => (&sig::ECDSA_P256_SHA256_FIXED, k),
            (Key::P384(k), _) => (&sig::ECDSA_P384_SHA384_FIXED, k),
            (Key::Ed25519(k), _) => (&sig::ED25519, k),
        };
        UnparsedPublicKey::new(vk, raw)
            .verify(signed, signature)
            .is_ok()
    }
}

fn hmac_alg(alg: Alg) -> hmac::Algorithm {
    match alg {
        Alg::HS384 => hmac::HMAC_SHA384,
        Alg::HS512 => hmac::HMAC_SHA512,
        _ => hmac::HMAC_SHA256,
    }
}

impl Key {
    /// An HMAC secret, ready for HS256/384/512.
    pub(crate) fn hmac(secret: &[u8]) -> Key {
        let k = |a| hmac::Key::new(a, secret);
        Key::Hmac(Box::new([
            k(hmac::HMAC_SHA256),
            k(hmac::HMAC_SHA384),
            k(hmac::HMAC_SHA512),
        ]))
    }
}

/// Constant-time check of the token's MAC (`ring::hmac::verify`).
fn hmac_eq(alg: Alg, keys: &[hmac::Key; 3], signed: &[u8], signature: &[u8]) -> bool {
    let k = match alg {
        Alg::HS384 => &keys[1],
        Alg::HS512 => &keys[2],
        _ => &keys[0],
    };
    hmac::verify(k, signed, signature).is_ok()
}

/// Signs `signing_input` with `alg`: `key` is the HMAC secret, or a PKCS#8 `PRIVATE KEY` PEM for the others.
pub(crate) fn sign(alg: Alg, key: &str, signing_input: &[u8]) -> Result<Vec<u8>, String> {
    if alg.is_hmac() {
        let k = hmac::Key::new(hmac_alg(alg), key.as_bytes());
        return Ok(hmac::sign(&k, signing_input).as_ref().to_vec());
    }
    let rng = ring::rand::SystemRandom::new();
    let (_, der) = pem(key).ok_or("private key: not PEM")?;
    let err = |e: ring::error::KeyRejected| format!("private key: {e}");
    let unspecified = |_| "signing failed".to_owned();
    use Alg::*;
    match alg {
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => {
            let kp = sig::RsaKeyPair::from_pkcs8(&der).map_err(err)?;
            let enc: &'static dyn sig::RsaEncoding = match alg {
                RS256 => &sig::RSA_PKCS1_SHA256,
                RS384 => &sig::RSA_PKCS1_SHA384,
                RS512 => &sig::RSA_PKCS1_SHA512,
                PS256 => &sig::RSA_PSS_SHA256,
                PS384 => &sig::RSA_PSS_SHA384,
                _ => &sig::RSA_PSS_SHA512,
            };
            let mut out = vec![0; kp.public().modulus_len()];
            kp.sign(enc, &rng, signing_input, &mut out)
                .map_err(unspecified)?;
            Ok(out)
        }
        ES256 | ES384 => {
            let a = if alg == ES256 {
                &sig::ECDSA_P256_SHA256_FIXED_SIGNING
            } else {
                &sig::ECDSA_P384_SHA384_FIXED_SIGNING
            };
            let kp = sig::EcdsaKeyPair::from_pkcs8(a, &der, &rng).map_err(err)?;
            Ok(kp
                .sign(&rng, signing_input)
                .map_err(unspecified)?
                .as_ref()
                .to_vec())
        }
        EdDSA => {
            let kp = sig::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(err)?;
            Ok(kp.sign(signing_input).as_ref().to_vec())
        }
        _ => Err(format!("{} is not supported", alg.name())),
    }
}
