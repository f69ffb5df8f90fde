//! The `clusterset.local` names of the MCS DNS specification (schema 1.0.0), as text: what
//! `explain` and `inspect` show next to a frontend, and what the agent's DNS server answers.

/// The zone every name is in.
pub const ZONE: &str = "clusterset.local";

/// Whether `s` can be one label of a DNS name (letters, digits and `-`, at most 63).
pub fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The DNS names of a service port: `<svc>.<ns>.svc.clusterset.local.` and, for a named port
/// of a known protocol (TCP, UDP, SCTP), its SRV name
/// `_<port>._<protocol>.<svc>.<ns>.svc.clusterset.local.`. None when the namespace or name is
/// not a DNS label.
///
/// ```
/// use dataplane_core::model::dns::service_port_names;
/// assert_eq!(
///     service_port_names("demo", "web", "http", "TCP"),
///     ["web.demo.svc.clusterset.local.", "_http._tcp.web.demo.svc.clusterset.local."]
/// );
/// ```
pub fn service_port_names(
    namespace: &str,
    name: &str,
    port_name: &str,
    protocol: &str,
) -> Vec<String> {
    if !is_label(namespace) || !is_label(name) {
        return Vec::new();
    }
    let service = format!("{name}.{namespace}.svc.{ZONE}.").to_ascii_lowercase();
    let srv = match protocol {
        "TCP" | "UDP" | "SCTP" if is_label(port_name) => Some(format!(
            "_{}._{}.{service}",
            port_name.to_ascii_lowercase(),
            protocol.to_ascii_lowercase()
        )),
        _ => None,
    };
    std::iter::once(service).chain(srv).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_named_unnamed_and_bad_ports() {
        assert_eq!(
            service_port_names("demo", "web", "http", "TCP"),
            [
                "web.demo.svc.clusterset.local.",
                "_http._tcp.web.demo.svc.clusterset.local."
            ]
        );
        assert_eq!(
            service_port_names("demo", "web", "", "UDP"),
            ["web.demo.svc.clusterset.local."]
        );
        assert_eq!(
            service_port_names("demo", "web", "dns", "ICMP"),
            ["web.demo.svc.clusterset.local."]
        );
        assert!(service_port_names("demo", "Bad_Name", "", "TCP").is_empty());
    }
}
