//! The standalone demo (`cargo xtask demo`): a ClusterSet directory comes alive on one host.
//!
//! Each member cluster gets a network namespace with a backend on every endpoint address and
//! port of its EndpointSlices. The agent runs in standalone mode (`run --clusterset-dir`),
//! merges the clusters and programs the socket load balancer for a client namespace, and serves
//! `clusterset.local` DNS on loopback. The demo resolves every service by name, then probes the
//! address it got for every port and family from the client and prints which clusters
//! answered, next to the clusters the merge made eligible and the conflicts it reported.
//! Everything it creates is removed on exit and on Ctrl-C. Root only.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::{Context as _, bail};
use dataplane_agent::source::clusterset_dir;
use dataplane_core::{
    lb::Protocol,
    merge::conditions::{ConditionStatus, ConditionType},
    model::ClusterId,
};
use hickory_proto::{op::ResponseCode, rr::RecordType};
use tests::{
    agent::Agent,
    clusterset,
    dns::{self, Transport},
    netns::Topology,
    probe::by_cluster,
};

static STOP: AtomicBool = AtomicBool::new(false);

struct Args {
    dir: PathBuf,
    probes: u32,
    wait: bool,
    report: PathBuf,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        dir: PathBuf::from("examples/clusterset"),
        probes: 20,
        wait: false,
        report: PathBuf::from("target/demo/report.yaml"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--dir" => args.dir = it.next().context("--dir needs a value")?.into(),
            "--probes" => {
                args.probes = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .context("--probes needs a number")?
            }
            "--wait" => args.wait = true,
            "--report" => args.report = it.next().context("--report needs a value")?.into(),
            other => bail!(
                "unknown argument {other:?} (use --dir DIR, --probes N, --report FILE, --wait)"
            ),
        }
    }
    Ok(args)
}

fn main() {
    if let Err(e) = demo() {
        eprintln!("demo failed: {e:#}");
        std::process::exit(1);
    }
}

fn demo() -> anyhow::Result<()> {
    let args = parse_args()?;
    if !tests::netns::privileged() {
        bail!("the demo creates network namespaces and attaches eBPF programs: run it as root");
    }
    ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst))
        .context("installing the Ctrl-C handler")?;

    let ids = clusterset::cluster_ids(&args.dir)?;
    let Some(importing) = ids.first().cloned() else {
        bail!("{} has no cluster directories", args.dir.display());
    };
    let importing_id = ClusterId::new(importing.clone())?;
    let plan = clusterset_dir::plan(&args.dir, Some(&importing_id))?;

    println!(
        "ClusterSet {} with clusters {}",
        args.dir.display(),
        ids.join(", ")
    );
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut topo = Topology::new(&names)?;
    let backends = clusterset::start_backends(&mut topo, &args.dir)?;
    println!(
        "started {backends} backends in {} cluster namespaces",
        ids.len()
    );

    if let Some(parent) = args.report.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let report = std::path::absolute(&args.report)?;
    let dir = args.dir.canonicalize()?;
    let dns_addr = std::net::SocketAddr::from(([127, 0, 0, 1], dns::free_port()?));
    let mut agent = Agent::start(
        &topo,
        &[
            "run",
            "--clusterset-dir",
            &dir.display().to_string(),
            "--cluster",
            &importing,
            "--report",
            &report.display().to_string(),
            "--dns-listen",
            &dns_addr.to_string(),
        ],
    )?;
    let expected = plan.lb.frontends.len() + plan.lb.vips.len();
    agent.wait_for(
        "the agent to program every frontend",
        Duration::from_secs(30),
        |i| i.frontends.len() == expected,
    )?;
    println!(
        "agent running in standalone mode as cluster {importing}; report at {}",
        report.display()
    );
    dns::wait_ready(dns_addr, "dns-version.clusterset.local.", 100)?;
    // Every service by name: its addresses, and the SRV record of each named port.
    println!("\nclusterset.local DNS, served by the agent on {dns_addr}:");
    let mut resolved: BTreeMap<(String, bool), Option<std::net::IpAddr>> = BTreeMap::new();
    let mut services: BTreeSet<(String, String)> = BTreeSet::new();
    for fe in plan.lb.frontends.values() {
        services.insert((
            fe.service.namespace.to_string(),
            fe.service.name.to_string(),
        ));
    }
    for (namespace, name) in &services {
        let fqdn = format!("{name}.{namespace}.svc.clusterset.local.");
        let mut shown = Vec::new();
        for (rtype, v4) in [(RecordType::A, true), (RecordType::AAAA, false)] {
            let reply = dns::query_blocking(dns_addr, Transport::Udp, &fqdn, rtype)?;
            let ip = reply.data().first().and_then(|d| d.parse().ok());
            if let Some(ip) = ip {
                shown.push(format!("{rtype} {ip}"));
            }
            resolved.insert((fqdn.clone(), v4), ip);
        }
        println!("  {fqdn:<44} {}", shown.join("  "));
        // Each named port once per protocol (a port is a frontend per family).
        let ports: BTreeSet<(String, Protocol)> = plan
            .lb
            .frontends
            .iter()
            .filter(|(_, f)| *f.service.namespace == **namespace && *f.service.name == **name)
            .filter(|(_, f)| !f.port_name.is_empty())
            .map(|(a, f)| (f.port_name.clone(), a.protocol))
            .collect();
        for (port_name, protocol) in ports {
            let srv = format!(
                "_{port_name}._{}.{fqdn}",
                protocol.to_string().to_lowercase()
            );
            let reply = dns::query_blocking(dns_addr, Transport::Udp, &srv, RecordType::SRV)?;
            let text = if reply.code == ResponseCode::NoError {
                reply.data().join(", ")
            } else {
                format!("{:?}", reply.code)
            };
            println!("  {srv:<44} SRV {text}");
        }
    }
    println!();

    // Conflicts, invalid exports and refused endpoints, per service, as the merge reported them.
    let mut notes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in &plan.merged.merge.export_statuses {
        let service = format!("{}/{}", e.service.namespace, e.service.name);
        for c in e.conditions.iter() {
            let bad = match c.type_ {
                ConditionType::Conflict => c.status == ConditionStatus::True,
                ConditionType::Valid => c.status == ConditionStatus::False,
                ConditionType::EndpointsRefused => c.status == ConditionStatus::True,
                ConditionType::Ready => false,
            };
            if bad {
                let note = match c.type_ {
                    ConditionType::Valid => format!("{}:Valid=False/{}", e.cluster, c.reason),
                    ConditionType::EndpointsRefused => {
                        format!("{}:EndpointsRefused/{}", e.cluster, c.reason)
                    }
                    _ => c.reason.to_string(),
                };
                notes.entry(service.clone()).or_default().insert(note);
            }
        }
    }

    println!(
        "{:<12} {:<10} {:<6} {:<16} {:<34} {:<22} CONFLICTS",
        "SERVICE",
        "PORT",
        "FAMILY",
        "VIP",
        format!("ANSWERED ({} probes)", args.probes),
        "ELIGIBLE"
    );
    let mut mismatches = 0;
    for (addr, fe) in &plan.lb.frontends {
        if STOP.load(Ordering::SeqCst) {
            println!("interrupted");
            return Ok(());
        }
        // The address comes from DNS: the name must resolve to the frontend's VIP.
        let fqdn = format!(
            "{}.{}.svc.clusterset.local.",
            fe.service.name, fe.service.namespace
        );
        let by_name = resolved.get(&(fqdn, addr.ip.is_ipv4())).copied().flatten();
        if by_name != Some(addr.ip) {
            mismatches += 1;
            println!(
                "{} resolves to {by_name:?}, not {}   <-- MISMATCH",
                fe.service, addr.ip
            );
            continue;
        }
        let (mode, target) = match (addr.protocol, addr.ip) {
            (Protocol::Tcp, std::net::IpAddr::V4(ip)) => ("tcp", format!("{ip}:{}", addr.port)),
            (Protocol::Tcp, std::net::IpAddr::V6(ip)) => ("tcp", format!("[{ip}]:{}", addr.port)),
            (Protocol::Udp, std::net::IpAddr::V4(ip)) => ("udp", format!("{ip}:{}", addr.port)),
            (Protocol::Udp, std::net::IpAddr::V6(ip)) => ("udp", format!("[{ip}]:{}", addr.port)),
        };
        let attempts = topo.probe(mode, &target, &["--count", &args.probes.to_string()])?;
        let answered = by_cluster(&attempts);
        let answered_text = answered
            .iter()
            .map(|(k, v)| match k.strip_prefix("error:") {
                Some("111") => format!("refused:{v}"),
                Some(errno) => format!("error {errno}:{v}"),
                None => format!("{k}:{v}"),
            })
            .collect::<Vec<_>>()
            .join(" ");
        let eligible: BTreeSet<String> =
            fe.backends.iter().map(|b| b.cluster.to_string()).collect();
        let reached: BTreeSet<String> = answered
            .keys()
            .filter(|k| !k.starts_with("error:"))
            .cloned()
            .collect();
        let ok = if eligible.is_empty() {
            reached.is_empty()
        } else {
            reached.is_subset(&eligible) && !reached.is_empty()
        };
        if !ok {
            mismatches += 1;
        }
        let service = format!("{}/{}", fe.service.namespace, fe.service.name);
        println!(
            "{:<12} {:<10} {:<6} {:<16} {:<34} {:<22} {}{}",
            service,
            format!("{}/{}", addr.port, addr.protocol),
            if addr.ip.is_ipv4() { "IPv4" } else { "IPv6" },
            addr.ip.to_string(),
            answered_text,
            if eligible.is_empty() {
                "none (refused)".to_owned()
            } else {
                eligible.into_iter().collect::<Vec<_>>().join(",")
            },
            notes
                .get(&service)
                .map(|n| n.iter().cloned().collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|| "-".into()),
            if ok { "" } else { "   <-- MISMATCH" },
        );
    }
    for (service, n) in &notes {
        if !plan
            .lb
            .frontends
            .values()
            .any(|f| format!("{}/{}", f.service.namespace, f.service.name) == *service)
        {
            println!(
                "{service:<12} (not imported) {}",
                n.iter().cloned().collect::<Vec<_>>().join(" ")
            );
        }
    }
    let i = tests::agent::inspect(&topo.pin_dir)?;
    let refused: u64 = i.frontends.iter().map(|f| f.rejects).sum();
    let translated: u64 = i.frontends.iter().map(|f| f.translations).sum();
    println!(
        "\nmaps: {} frontends, {translated} connections translated, {refused} refused",
        i.frontends.len()
    );
    println!(
        "\nconflicts, as written to the ServiceExports (full report: {}):",
        report.display()
    );
    let mut seen = BTreeSet::new();
    for e in &plan.merged.merge.export_statuses {
        for c in e.conditions.iter() {
            let service = format!("{}/{}", e.service.namespace, e.service.name);
            let interesting = (c.type_ == ConditionType::Conflict
                && c.status == ConditionStatus::True)
                || (c.type_ == ConditionType::Valid && c.status == ConditionStatus::False);
            if interesting && seen.insert((service.clone(), c.message.clone())) {
                println!("  {service} [{}]: {}", c.reason, c.message);
            }
        }
    }
    if args.wait {
        println!(
            "\nthe demo keeps running; try `dataplane-agent inspect --pin-dir {}`. Ctrl-C to clean up.",
            topo.pin_dir.display()
        );
        while !STOP.load(Ordering::SeqCst) && agent.running() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    drop(agent);
    drop(topo);
    println!("cleaned up namespaces, cgroup and pins");
    if mismatches > 0 {
        bail!(
            "{mismatches} frontends did not resolve to their VIP or were answered by clusters the merge did not make eligible"
        );
    }
    Ok(())
}
