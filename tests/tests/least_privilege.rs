//! Least privilege (root only): the node role exactly as `deploy/daemonset.yaml` runs it
//! (`run --config --roles node`), as uid 0 with only the capabilities the DaemonSet adds and
//! the cgroup mounted read-only, routes a connection to a ClusterSet IP to its backend, in the
//! test's network namespaces and child cgroup. Every API request it makes is allowed by
//! `deploy/rbac/node.yaml`, and none writes. Without CAP_BPF it exits with an error that names
//! the capabilities, not a panic.
//!
//! The agent runs under `unshare --mount` (a private mount namespace where the test's cgroup is
//! bind-mounted read-only, as the DaemonSet's hostPath is) and `setpriv` (util-linux): bounding,
//! inheritable and ambient sets cut to the listed capabilities, no_new_privs, uid 0. The
//! capabilities of the running agent are read back from `/proc/PID/status`.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use dataplane_core::{
    fixtures::{endpoint, import, imported_slice},
    model::{FIELD_MANAGER, IpFamily, LABEL_APP_MANAGED_BY, LABEL_MANAGED_BY, MANAGED_BY},
};
use serde_yaml::Value;
use tests::{
    agent::{Agent, frontend},
    fake_apiserver::{FakeApiServer, RecordedRequest},
    netns::Topology,
    probe::by_cluster,
    require_root,
};

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
const WAIT: Duration = Duration::from_secs(30);
const NS: &str = "demo";
const VIP: &str = "241.0.9.1";

/// The capabilities the node DaemonSet adds (after `drop: [ALL]`), as `setpriv` names them.
const NODE_CAPS: [&str; 3] = ["bpf", "net_admin", "perfmon"];

/// Capability numbers (include/uapi/linux/capability.h).
fn cap_number(name: &str) -> u32 {
    match name {
        "net_admin" => 12,
        "sys_admin" => 21,
        "perfmon" => 38,
        "bpf" => 39,
        other => panic!("unknown capability {other}"),
    }
}

fn yaml_docs(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(Path::new(DEPLOY).join(path)).expect(path);
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

/// The wrapper that runs the agent as the DaemonSet does: a private mount namespace with
/// `cgroup` bind-mounted read-only onto itself, then uid 0 with only `caps`.
fn confined(cgroup: &Path, caps: &[&str]) -> Vec<String> {
    let set = std::iter::once("-all".to_owned())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let cgroup = cgroup.to_str().expect("utf-8").to_owned();
    [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        r#"mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@""#,
        "sh",
        &cgroup,
        "setpriv",
        &format!("--bounding-set={set}"),
        &format!("--inh-caps={set}"),
        &format!("--ambient-caps={set}"),
        "--no-new-privs",
        "--",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// One import (VIP:80) and its imported slice from cluster `east` (`10.99.1.10:8080`), as the
/// controller would have written them; and the node's config, reading nothing but this API.
fn seeded_api(rt: &tokio::runtime::Runtime, topo: &Topology) -> (FakeApiServer, String) {
    let api = rt.block_on(FakeApiServer::start()).expect("api");
    api.put(
        &import(NS, "web")
            .managed()
            .ips([VIP])
            .families(&[IpFamily::IPv4])
            .port(("http", "TCP", 80))
            .build(),
    );
    let backend = topo.cluster("east").v4(10).to_string();
    api.put(
        &imported_slice(NS, "web-east", "web", "east")
            .label(LABEL_MANAGED_BY, MANAGED_BY)
            .endpoints([endpoint(&backend).conditions((Some(true), None, None))])
            .port(("http", "TCP", 8080))
            .build(),
    );
    let dir = topo.dir.join("kube");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("east.kubeconfig"), api.kubeconfig()).expect("write");
    let config = dir.join("clusterset.yaml");
    std::fs::write(
        &config,
        "localCluster: east\nmembers:\n- id: east\n  kubeconfig: east.kubeconfig\n",
    )
    .expect("write");
    (api, config.to_str().expect("utf-8").to_owned())
}

fn start_node(topo: &Topology, config: &str, caps: &[&str]) -> Agent {
    let wrapper = confined(&topo.cgroup, caps);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    Agent::start_wrapped(
        topo,
        &topo.pin_dir,
        &wrapper,
        &[
            "run",
            "--config",
            config,
            "--roles",
            "node",
            "--metrics-address",
            "127.0.0.1:0",
            "--health-address",
            "127.0.0.1:0",
        ],
        &[],
    )
    .expect("start agent")
}

/// `CapXxx` masks of a running process.
fn capabilities(pid: u32) -> BTreeMap<String, u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .filter_map(|l| l.strip_prefix("Cap"))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| {
            (
                k.to_owned(),
                u64::from_str_radix(v.trim(), 16).expect("hex"),
            )
        })
        .collect()
}

/// (apiGroup, resource[/subresource], verb, name) of a resource request, as RBAC sees it;
/// `None` for non-resource URLs such as `/version`.
fn rbac_attributes(r: &RecordedRequest) -> Option<(String, String, String, Option<String>)> {
    let segs: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        rest => rest,
    };
    let (resource, name, sub) = (rest.first()?, rest.get(1), rest.get(2));
    let verb = match r.method.as_str() {
        "GET" if r.is_watch() => "watch",
        "GET" if name.is_some() => "get",
        "GET" => "list",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        other => other,
    };
    let resource = match sub {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_string(),
    };
    Some((
        group.to_owned(),
        resource,
        verb.to_owned(),
        name.map(|n| n.to_string()),
    ))
}

/// Whether a ClusterRole's `rules` allow the request.
fn allowed(
    rules: &Value,
    (group, resource, verb, name): &(String, String, String, Option<String>),
) -> bool {
    let any = |list: Vec<String>, want: &str| list.iter().any(|v| v == want || v == "*");
    rules.as_sequence().into_iter().flatten().any(|rule| {
        let names = strings(&rule["resourceNames"]);
        any(strings(&rule["apiGroups"]), group)
            && any(strings(&rule["resources"]), resource)
            && any(strings(&rule["verbs"]), verb)
            && (names.is_empty() || name.as_ref().is_some_and(|n| names.contains(n)))
    })
}

/// The admission policy names what the controller writes: both managed-by label keys and
/// their value, and the field manager whose objects it may write again after their label was
/// removed.
#[test]
fn the_admission_policy_names_the_labels_and_field_manager_the_agent_writes() {
    let policy = yaml_docs("policy/managed-objects.yaml").remove(0);
    let text = serde_yaml::to_string(&policy["spec"]).expect("yaml");
    for literal in [
        format!("'{LABEL_MANAGED_BY}'"),
        format!("'{LABEL_APP_MANAGED_BY}'"),
        format!("'{MANAGED_BY}'"),
        format!("f.manager == '{FIELD_MANAGER}'"),
    ] {
        assert!(
            text.contains(&literal),
            "{literal} not in the policy: {text}"
        );
    }
}

/// The DaemonSet this test stands for: node role only, the capabilities of [`NODE_CAPS`] and no
/// more, not privileged, the cgroup mounted read-only, no member credentials.
#[test]
fn daemonset_grants_the_tested_capabilities_and_nothing_else() {
    let ds = yaml_docs("daemonset.yaml").remove(0);
    let spec = &ds["spec"]["template"]["spec"];
    let agent = spec["containers"]
        .as_sequence()
        .and_then(|c| c.iter().find(|c| c["name"] == "agent"))
        .expect("the agent container");
    let sc = &agent["securityContext"];
    assert_eq!(sc["privileged"], Value::Null, "{sc:?}");
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    let mut added: Vec<String> = strings(&sc["capabilities"]["add"])
        .iter()
        .map(|c| c.to_lowercase())
        .collect();
    added.sort();
    assert_eq!(added, NODE_CAPS, "the DaemonSet adds what this test grants");
    assert_eq!(sc["runAsUser"], Value::from(0));
    assert!(strings(&agent["args"]).contains(&"--roles=node".to_owned()));
    let mounts = agent["volumeMounts"].as_sequence().expect("mounts");
    let cgroup = mounts
        .iter()
        .find(|m| m["name"] == "cgroup2")
        .expect("cgroup2 mount");
    assert_eq!(cgroup["readOnly"], Value::from(true));
    assert!(
        !mounts.iter().any(|m| m["name"] == "members"),
        "member kubeconfigs are the controller's"
    );
    assert_eq!(spec["serviceAccountName"], "mcs-dataplane-node");
}

#[test]
fn node_role_routes_with_only_bpf_net_admin_and_perfmon_on_a_read_only_cgroup() {
    require_root!();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut topo = Topology::new(&["east"]).expect("topology");
    topo.start_backend("east", 10, &["tcp:8080"])
        .expect("backend");
    let (api, config) = seeded_api(&rt, &topo);
    let backend = topo.cluster("east").v4(10).to_string();

    let mut agent = start_node(&topo, &config, &NODE_CAPS);
    let routed = |i: &dataplane_agent::bpf::inspect::Inspection| {
        frontend(i, VIP, 80, "TCP")
            .is_some_and(|f| f.backends.iter().any(|b| b.ip == backend && b.port == 8080))
    };
    agent
        .wait_for("the import in the maps", WAIT, routed)
        .expect("routed");

    // Only the granted capabilities, in every set (uid 0: permitted and effective follow the
    // bounding set).
    let want: u64 = NODE_CAPS.iter().map(|c| 1u64 << cap_number(c)).sum();
    let caps = capabilities(agent.pid().expect("pid"));
    for set in ["Prm", "Eff", "Bnd", "Amb"] {
        assert_eq!(caps[set], want, "Cap{set} of the agent: {caps:x?}");
    }
    assert_eq!(caps["Eff"] & (1 << cap_number("sys_admin")), 0);
    let log = agent.log_text();
    assert!(log.contains("attached the socket-LB programs"), "{log}");

    let hits = topo
        .probe("tcp", &format!("{VIP}:80"), &["--count", "20"])
        .expect("probe");
    assert!(hits.iter().all(|a| a.ok), "{hits:?}");
    assert_eq!(
        by_cluster(&hits),
        BTreeMap::from([("east".to_owned(), 20)]),
        "every connection reaches east's backend"
    );

    // A restart with the same capabilities adopts the pinned links (the program pins make that
    // possible without CAP_SYS_ADMIN) and keeps routing.
    agent.kill(libc::SIGTERM);
    let mut agent = start_node(&topo, &config, &NODE_CAPS);
    agent
        .wait_for("the import after the restart", WAIT, routed)
        .expect("routed again");
    agent
        .wait_log("the dataplane", WAIT, |log| log.contains("dataplane ready"))
        .expect("started");
    assert!(
        agent
            .log_text()
            .contains("adopted the pinned programs and links"),
        "{}",
        agent.log_text()
    );
    let hits = topo
        .probe("tcp", &format!("{VIP}:80"), &["--count", "10"])
        .expect("probe");
    assert!(hits.iter().all(|a| a.ok), "{hits:?}");
    drop(agent);

    // Read-only on the API: every request is allowed by the node's ClusterRole, none writes.
    let role = yaml_docs("rbac/node.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole")
        .expect("ClusterRole");
    let requests = api.requests();
    assert!(
        requests.iter().any(RecordedRequest::is_watch),
        "{requests:?}"
    );
    for r in &requests {
        assert!(
            !r.is_write(),
            "the node role wrote: {} {}",
            r.method,
            r.path
        );
        if let Some(attrs) = rbac_attributes(r) {
            assert!(
                allowed(&role["rules"], &attrs),
                "deploy/rbac/node.yaml does not allow {attrs:?} ({} {})",
                r.method,
                r.path
            );
        }
    }
}

#[test]
fn node_role_without_cap_bpf_exits_with_an_error_naming_the_capabilities() {
    require_root!();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let topo = Topology::new(&["east"]).expect("topology");
    let (_api, config) = seeded_api(&rt, &topo);
    let mut agent = start_node(&topo, &config, &["net_admin", "perfmon"]);
    let deadline = Instant::now() + WAIT;
    while agent.running() {
        assert!(Instant::now() < deadline, "{}", agent.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = agent.log_text();
    assert!(
        log.contains(
            "not permitted (the agent needs uid 0 with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON"
        ),
        "{log}"
    );
    assert!(log.contains("Operation not permitted"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// The controller role as `deploy/controller.yaml` runs it (no `--cgroup`, no host mounts)
/// loads no eBPF, so it starts on a host without a cgroup2 mount (cgroup v1 nodes): here a
/// private mount namespace with every cgroup2 mount taken away.
#[test]
fn controller_role_needs_no_cgroup2_mount() {
    require_root!();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let topo = Topology::new(&["east"]).expect("topology");
    let (api, config) = seeded_api(&rt, &topo);
    let log_path = topo.dir.join("controller.log");
    let log = std::fs::File::create(&log_path).expect("log");
    // Not `Agent`: it passes `--cgroup`, which is what this test leaves out.
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(concat!(
            r#"awk '$3 == "cgroup2" {print $2}' /proc/self/mounts | sort -r | xargs -r -n1 umount -l"#,
            r#" && ! grep -q ' cgroup2 ' /proc/self/mounts && exec "$@""#
        ))
        .arg("sh")
        .arg(tests::netns::agent_bin())
        .args(["run", "--config", &config, "--roles", "controller"])
        .args(["--metrics-address", "127.0.0.1:0", "--health-address", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log);
    let child = tests::netns::die_with_parent(&mut cmd)
        .spawn()
        .expect("spawn");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(child);
    let text = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // It runs for the election: the Lease is read.
    let deadline = Instant::now() + WAIT;
    while !api.requests().iter().any(|r| r.path.contains("/leases")) {
        let exited = child.0.try_wait().expect("wait").is_some();
        assert!(!exited && Instant::now() < deadline, "{}", text());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.0.try_wait().expect("wait").is_none(), "{}", text());
    assert!(text().contains("kubernetes mode"), "{}", text());
}
