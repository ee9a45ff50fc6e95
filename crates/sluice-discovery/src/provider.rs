//! A Dubbo provider's registry entry: the name of a child of `{root}/{interface}/providers`, one URL-encoded
//! `dubbo://host:port/interface?version=..&group=..&weight=..` each. Entries come from Zookeeper, which is trusted
//! as the source of nodes (any address it names becomes a node), but an entry that does not parse is skipped with
//! a log line, never a failure.

use url::Url;

/// Dubbo's default provider weight.
pub const DEFAULT_WEIGHT: u32 = 100;
/// Longer entries are refused before parsing (Dubbo's are a few hundred bytes; ZK allows names up to 1 MiB).
pub const MAX_ENTRY: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    pub protocol: String,
    /// An IP address or a name, IPv6 without brackets.
    pub host: String,
    pub port: u16,
    pub version: Option<String>,
    pub group: Option<String>,
    pub weight: u32,
    /// `enabled=false` or `disabled=true`: an operator took it out of rotation.
    pub disabled: bool,
}

/// Parses one child name of a providers node.
pub fn parse(entry: &str) -> Result<Provider, String> {
    if entry.len() > MAX_ENTRY {
        return Err(format!("entry of {} bytes", entry.len()));
    }
    let decoded = percent_encoding::percent_decode_str(entry)
        .decode_utf8()
        .map_err(|_| "not UTF-8 once decoded".to_owned())?;
    let url = Url::parse(&decoded).map_err(|e| format!("not a URL: {e}"))?;
    // IP addresses only: Dubbo registers those, and a name would be resolved when the snapshot compiles (a
    // blocking lookup, and one that fails would refuse the whole configuration).
    let host = match url.host() {
        Some(url::Host::Ipv6(a)) => a.to_string(),
        Some(url::Host::Ipv4(a)) => a.to_string(),
        Some(url::Host::Domain(d)) => match d.parse::<std::net::IpAddr>() {
            Ok(a) => a.to_string(),
            Err(_) => return Err(format!("host {d:?} is not an IP address")),
        },
        None => return Err("no host".into()),
    };
    let port = match url.port() {
        Some(0) | None => return Err("no port".into()),
        Some(p) => p,
    };
    let mut p = Provider {
        protocol: url.scheme().to_owned(),
        host,
        port,
        version: None,
        group: None,
        weight: DEFAULT_WEIGHT,
        disabled: false,
    };
    for (k, v) in url.query_pairs() {
        match &*k {
            "version" if !v.is_empty() => p.version = Some(v.into_owned()),
            "group" if !v.is_empty() => p.group = Some(v.into_owned()),
            "weight" => p.weight = v.parse::<u32>().map_err(|_| format!("bad weight {v:?}"))?,
            "enabled" if v == "false" => p.disabled = true,
            "disabled" if v == "true" => p.disabled = true,
            _ => {}
        }
    }
    Ok(p)
}

/// Whether `p` serves what the upstream's `discovery_args` ask: the same protocol (default `dubbo`), version
/// and group (a missing one matches only providers without; `*` matches any, as a Dubbo consumer's), and not
/// disabled.
pub fn matches(p: &Provider, protocol: &str, version: Option<&str>, group: Option<&str>) -> bool {
    let same = |want: Option<&str>, have: &Option<String>| match want {
        Some("*") => true,
        want => want == have.as_deref(),
    };
    !p.disabled && p.protocol == protocol && same(version, &p.version) && same(group, &p.group)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JAVA: &str = "dubbo%3A%2F%2F%5B%3A%3A1%5D%3A20991%2Forg.sluice.peer.DemoService%3Fapplication%3Dsluice-java-peer%26deprecated%3Dfalse%26dubbo%3D2.0.2%26interface%3Dorg.sluice.peer.DemoService%26methods%3Dhello%26side%3Dprovider%26version%3D1.0.0";

    #[test]
    fn a_java_providers_entry() {
        let p = parse(JAVA).expect("parses");
        assert_eq!(p.protocol, "dubbo");
        assert_eq!((p.host.as_str(), p.port), ("::1", 20991));
        assert_eq!(p.version.as_deref(), Some("1.0.0"));
        assert_eq!((p.group, p.weight, p.disabled), (None, 100, false));
    }

    #[test]
    fn weight_group_and_switches() {
        let p = parse(
            "dubbo%3A%2F%2F10.0.0.7%3A20880%2Fa.B%3Fgroup%3Dg1%26weight%3D7%26version%3D2.0.0",
        )
        .expect("parses");
        assert_eq!((p.host.as_str(), p.port, p.weight), ("10.0.0.7", 20880, 7));
        assert!(matches(&p, "dubbo", Some("2.0.0"), Some("g1")));
        assert!(matches(&p, "dubbo", Some("*"), Some("*")));
        assert!(!matches(&p, "dubbo", Some("2.0.0"), None));
        assert!(!matches(&p, "dubbo", Some("1.0.0"), Some("g1")));
        assert!(!matches(&p, "tri", Some("2.0.0"), Some("g1")));
        for off in ["enabled%3Dfalse", "disabled%3Dtrue"] {
            let p =
                parse(&format!("dubbo%3A%2F%2F10.0.0.7%3A20880%2Fa.B%3F{off}")).expect("parses");
            assert!(p.disabled && !matches(&p, "dubbo", None, None), "{off}");
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let huge = format!("dubbo%3A%2F%2F1.2.3.4%3A1%2Fa%3F{}", "x".repeat(MAX_ENTRY));
        for bad in [
            "",
            "not a url",
            "dubbo%3A%2F%2F1.2.3.4%3A99999%2Fa",
            "dubbo%3A%2F%2F1.2.3.4%2Fa",
            "dubbo%3A%2F%2F1.2.3.4%3A0%2Fa",
            "dubbo%3A%2F%2F%3A20880%2Fa",
            "dubbo%3A%2F%2F1.2.3.4%3A20880%2Fa%3Fweight%3D-1",
            "dubbo%3A%2F%2F1.2.3.4%3A20880%2Fa%3Fweight%3D99999999999",
            "%FF%FE",
            "dubbo://[::1:20880/a",
            &huge,
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn any_address_is_a_node_names_are_not() {
        // Zookeeper is trusted: a provider elsewhere is just a node (reaching it is the network's business).
        let p = parse("dubbo%3A%2F%2F203.0.113.9%3A20880%2Fa").expect("parses");
        assert_eq!((p.host.as_str(), p.port), ("203.0.113.9", 20880));
        assert!(parse("dubbo%3A%2F%2Fprovider.example%3A20880%2Fa").is_err());
    }
}
