//! IP / CIDR sets for `remote_addrs` and the `ipmatch` operator.
//!
//! Owns parsing (at build time) and membership tests. It is a linear scan over the route's
//! few networks; it does not try to be a longest-prefix-match table for thousands of CIDRs.

use ipnet::IpNet;
use std::net::IpAddr;

/// A compiled list of networks; a bare IP is a /32 or /128.
#[derive(Debug, Clone, Default)]
pub(crate) struct IpSet {
    nets: Vec<IpNet>,
}

impl IpSet {
    pub(crate) fn parse<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut nets = Vec::new();
        for item in items {
            let item = item.trim();
            let net = match item.parse::<IpNet>() {
                Ok(n) => n,
                Err(_) => match item.parse::<IpAddr>() {
                    Ok(ip) => IpNet::from(ip),
                    Err(_) => return Err(format!("invalid IP address or CIDR {item:?}")),
                },
            };
            nets.push(net.trunc());
        }
        Ok(IpSet { nets })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 peer seen on a dual-stack socket arrives as ::ffff:a.b.c.d.
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }
}

#[cfg(test)]
mod tests {
    use super::IpSet;

    #[test]
    fn v4_v6_cidrs_and_mapped() {
        let s = IpSet::parse(["10.0.0.0/8", "192.168.1.7", "2001:db8::/32", "::1"]).unwrap();
        assert!(s.contains("10.1.2.3".parse().unwrap()));
        assert!(s.contains("192.168.1.7".parse().unwrap()));
        assert!(!s.contains("192.168.1.8".parse().unwrap()));
        assert!(s.contains("2001:db8::5".parse().unwrap()));
        assert!(s.contains("::1".parse().unwrap()));
        assert!(!s.contains("2001:db9::5".parse().unwrap()));
        assert!(s.contains("::ffff:10.9.9.9".parse().unwrap()));
        assert!(IpSet::parse(["10.0.0.0/33"]).is_err());
        assert!(IpSet::parse(["nope"]).is_err());
    }
}
