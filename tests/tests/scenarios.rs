//! Runs `plan` on every ClusterSet directory under `tests/scenarios/` and checks it against the
//! scenario's `expect.yaml` (targeted assertions written from the merge rules), plus invariants
//! that hold for every plan: reasons match the CRD pattern, `ips` align with `ipFamilies` and lie
//! in the ClusterSet CIDRs, slices are well formed, and the plan does not change when the files
//! and documents are reordered or when the produced imports are fed back as existing imports.
//!
//! `expect.yaml` keys (all optional except `description`):
//! - `cluster`: the importing cluster (default: the first cluster id);
//! - `expectError`: `plan` must fail with an error containing this text;
//! - `exports`: exactly the exports, `cluster/namespace/name` → `{Type: Status/Reason}`; a
//!   condition type not listed must be absent;
//! - `messages`: `cluster/namespace/name/Type` → substrings of that condition's message;
//! - `imports`: exactly the imports, `namespace/name` → fields (see [`ImportExpect`]);
//! - `slices`: exactly the services with imported slices, `namespace/name` →
//!   `cluster/family` → `{slices, endpoints, ports}`;
//! - `frontends`: exactly the frontends, `ns/name portName:port/PROTO family` → the clusters
//!   its backends are in (and optionally how many backends);
//! - `diagnostics`: substrings each found in some diagnostic, rendered as
//!   `file | cluster | object | message`; `diagnosticsCount`: their exact number.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::{Path, PathBuf},
};

use dataplane_agent::source::{clusterset_dir, manifests::parse_documents};
use dataplane_core::{
    merge::ClusterSetCidrs,
    model::{ClusterId, IpFamily, MANAGED_BY},
    plan,
};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Expect {
    #[allow(dead_code)]
    description: String,
    #[serde(default)]
    cluster: Option<String>,
    #[serde(default)]
    expect_error: Option<String>,
    #[serde(default)]
    exports: Option<BTreeMap<String, BTreeMap<String, String>>>,
    #[serde(default)]
    messages: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    imports: Option<BTreeMap<String, ImportExpect>>,
    #[serde(default)]
    slices: Option<BTreeMap<String, BTreeMap<String, SliceExpect>>>,
    #[serde(default)]
    frontends: Option<BTreeMap<String, FrontendExpect>>,
    #[serde(default)]
    diagnostics: Vec<String>,
    #[serde(default)]
    diagnostics_count: Option<usize>,
}

/// Expected fields of one import; unset fields are not checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ImportExpect {
    #[serde(rename = "type")]
    type_: Option<String>,
    /// `name:port/PROTO[/appProtocol]`, compared as a set.
    ports: Option<Vec<String>>,
    ip_families: Option<Vec<String>>,
    /// The number of `ips`.
    ips: Option<usize>,
    /// Exact `ips`.
    ip_values: Option<Vec<String>>,
    clusters: Option<Vec<String>>,
    /// `Status/Reason` of the `Ready` condition.
    ready: Option<String>,
    session_affinity: Option<String>,
    session_affinity_timeout: Option<i64>,
    internal_traffic_policy: Option<String>,
    /// `null` means absent.
    #[serde(default, deserialize_with = "some")]
    traffic_distribution: Option<Option<String>>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

fn some<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

#[derive(Deserialize, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
struct SliceExpect {
    slices: usize,
    endpoints: usize,
    /// `name:port/PROTO`, the union over the slices, sorted.
    ports: Vec<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FrontendExpect {
    Clusters(Vec<String>),
    Detailed {
        clusters: Vec<String>,
        backends: usize,
    },
}

fn scenarios_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios")
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn port_str(p: &Value) -> String {
    let mut out = format!(
        "{}:{}/{}",
        s(&p["name"]),
        s(&p["port"]),
        p["protocol"].as_str().unwrap_or("TCP")
    );
    if let Some(a) = p["appProtocol"].as_str() {
        out.push('/');
        out.push_str(a);
    }
    out
}

/// Checks one scenario; returns the list of failures.
fn check(dir: &Path) -> Vec<String> {
    let mut fails = Vec::new();
    let text = match std::fs::read_to_string(dir.join("expect.yaml")) {
        Ok(t) => t,
        Err(e) => return vec![format!("no expect.yaml: {e}")],
    };
    let expect: Expect = match serde_yaml::from_str(&text) {
        Ok(e) => e,
        Err(e) => return vec![format!("bad expect.yaml: {e}")],
    };
    let cluster = expect
        .cluster
        .as_ref()
        .map(|c| ClusterId::new(c.clone()).expect("cluster id in expect.yaml"));
    let result = clusterset_dir::plan(dir, cluster.as_ref());
    if let Some(want) = &expect.expect_error {
        match result {
            Ok(_) => fails.push(format!("expected an error containing {want:?}, got a plan")),
            Err(e) if e.to_string().contains(want.as_str()) => {}
            Err(e) => fails.push(format!("expected an error containing {want:?}, got {e}")),
        }
        return fails;
    }
    let plan = match result {
        Ok(p) => p,
        Err(e) => return vec![format!("plan failed: {e}")],
    };
    let json = plan.to_json();
    let v: Value = serde_json::from_str(&json).expect("plan JSON parses");
    let config = clusterset_dir::read(dir).expect("dir reads").config;

    // --- exports
    let mut exports: BTreeMap<String, &Value> = BTreeMap::new();
    for e in v["serviceExports"].as_array().into_iter().flatten() {
        exports.insert(
            format!(
                "{}/{}/{}",
                s(&e["cluster"]),
                s(&e["namespace"]),
                s(&e["name"])
            ),
            e,
        );
    }
    if let Some(want) = &expect.exports {
        let got: BTreeSet<&String> = exports.keys().collect();
        let keys: BTreeSet<&String> = want.keys().collect();
        if got != keys {
            fails.push(format!("exports: got {got:?}, want {keys:?}"));
        }
        for (key, conds) in want {
            let Some(e) = exports.get(key) else { continue };
            let got: BTreeMap<String, String> = e["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    (
                        s(&c["type"]),
                        format!("{}/{}", s(&c["status"]), s(&c["reason"])),
                    )
                })
                .collect();
            if &got != conds {
                fails.push(format!("export {key}: got {got:?}, want {conds:?}"));
            }
        }
    }
    for (key, subs) in &expect.messages {
        let (export, type_) = key.rsplit_once('/').expect("messages key ends with /Type");
        let msg = exports
            .get(export)
            .and_then(|e| {
                e["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == *type_)
                    .map(|c| s(&c["message"]))
            })
            .unwrap_or_default();
        for sub in subs {
            if !msg.contains(sub.as_str()) {
                fails.push(format!("message of {key} lacks {sub:?}: {msg:?}"));
            }
        }
    }

    // --- imports
    let imports: BTreeMap<String, &Value> = v["serviceImports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            (
                format!(
                    "{}/{}",
                    s(&i["metadata"]["namespace"]),
                    s(&i["metadata"]["name"])
                ),
                i,
            )
        })
        .collect();
    if let Some(want) = &expect.imports {
        let got: BTreeSet<&String> = imports.keys().collect();
        let keys: BTreeSet<&String> = want.keys().collect();
        if got != keys {
            fails.push(format!("imports: got {got:?}, want {keys:?}"));
        }
        for (key, w) in want {
            let Some(i) = imports.get(key) else { continue };
            let spec = &i["spec"];
            let mut field = |name: &str, got: String, want: &str| {
                if got != want {
                    fails.push(format!("import {key} {name}: got {got:?}, want {want:?}"));
                }
            };
            if let Some(t) = &w.type_ {
                field("type", s(&spec["type"]), t);
            }
            if let Some(p) = &w.ports {
                let got: BTreeSet<String> = spec["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(port_str)
                    .collect();
                let want: BTreeSet<String> = p.iter().cloned().collect();
                field("ports", format!("{got:?}"), &format!("{want:?}"));
            }
            if let Some(f) = &w.ip_families {
                field(
                    "ipFamilies",
                    spec["ipFamilies"].to_string(),
                    &serde_json::to_string(f).unwrap_or_default(),
                );
            }
            let ips: Vec<String> = spec["ips"]
                .as_array()
                .into_iter()
                .flatten()
                .map(s)
                .collect();
            if let Some(n) = w.ips {
                field("number of ips", ips.len().to_string(), &n.to_string());
            }
            if let Some(vals) = &w.ip_values {
                field("ips", format!("{ips:?}"), &format!("{vals:?}"));
            }
            if let Some(c) = &w.clusters {
                let got: Vec<String> = i["status"]["clusters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| s(&c["cluster"]))
                    .collect();
                field("clusters", format!("{got:?}"), &format!("{c:?}"));
            }
            if let Some(r) = &w.ready {
                let got = i["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Ready")
                    .map(|c| format!("{}/{}", s(&c["status"]), s(&c["reason"])))
                    .unwrap_or_default();
                field("Ready", got, r);
            }
            if let Some(a) = &w.session_affinity {
                field("sessionAffinity", s(&spec["sessionAffinity"]), a);
            }
            if let Some(t) = w.session_affinity_timeout {
                field(
                    "sessionAffinityConfig",
                    s(&spec["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"]),
                    &t.to_string(),
                );
            }
            if let Some(p) = &w.internal_traffic_policy {
                field(
                    "internalTrafficPolicy",
                    s(&spec["internalTrafficPolicy"]),
                    p,
                );
            }
            if let Some(td) = &w.traffic_distribution {
                field(
                    "trafficDistribution",
                    s(&spec["trafficDistribution"]),
                    td.as_deref().unwrap_or(""),
                );
            }
            for (name, want, got) in [
                ("labels", &w.labels, &i["metadata"]["labels"]),
                ("annotations", &w.annotations, &i["metadata"]["annotations"]),
            ] {
                if let Some(want) = want {
                    let got: BTreeMap<String, String> =
                        serde_json::from_value(got.clone()).unwrap_or_default();
                    field(name, format!("{got:?}"), &format!("{want:?}"));
                }
            }
        }
    }

    // --- slices
    let mut slices: BTreeMap<String, BTreeMap<String, SliceExpect>> = BTreeMap::new();
    for sl in v["endpointSlices"].as_array().into_iter().flatten() {
        let labels = &sl["metadata"]["labels"];
        let service = format!(
            "{}/{}",
            s(&sl["metadata"]["namespace"]),
            s(&labels["multicluster.kubernetes.io/service-name"])
        );
        let key = format!(
            "{}/{}",
            s(&labels["multicluster.kubernetes.io/source-cluster"]),
            s(&sl["addressType"])
        );
        let entry = slices
            .entry(service)
            .or_default()
            .entry(key)
            .or_insert(SliceExpect {
                slices: 0,
                endpoints: 0,
                ports: Vec::new(),
            });
        entry.slices += 1;
        entry.endpoints += sl["endpoints"].as_array().map_or(0, Vec::len);
        for p in sl["ports"].as_array().into_iter().flatten() {
            let p = port_str(p);
            if !entry.ports.contains(&p) {
                entry.ports.push(p);
            }
        }
        entry.ports.sort();
    }
    if let Some(want) = &expect.slices {
        let mut want_sorted: BTreeMap<String, BTreeMap<String, SliceExpect>> = BTreeMap::new();
        for (svc, per) in want {
            for (k, e) in per {
                let mut ports = e.ports.clone();
                ports.sort();
                want_sorted.entry(svc.clone()).or_default().insert(
                    k.clone(),
                    SliceExpect {
                        slices: e.slices,
                        endpoints: e.endpoints,
                        ports,
                    },
                );
            }
        }
        if slices != want_sorted {
            fails.push(format!(
                "slices:\n  got  {slices:?}\n  want {want_sorted:?}"
            ));
        }
    }

    // --- frontends
    let mut frontends: BTreeMap<String, (BTreeSet<String>, usize)> = BTreeMap::new();
    for f in v["frontends"].as_array().into_iter().flatten() {
        let ip: IpAddr = s(&f["ip"]).parse().expect("frontend ip");
        let key = format!(
            "{}/{} {}:{}/{} {}",
            s(&f["namespace"]),
            s(&f["name"]),
            s(&f["portName"]),
            s(&f["port"]),
            s(&f["protocol"]),
            IpFamily::of(&ip)
        );
        let backends = f["backends"].as_array().cloned().unwrap_or_default();
        let clusters = backends.iter().map(|b| s(&b["cluster"])).collect();
        frontends.insert(key, (clusters, backends.len()));
    }
    if let Some(want) = &expect.frontends {
        let got: BTreeSet<&String> = frontends.keys().collect();
        let keys: BTreeSet<&String> = want.keys().collect();
        if got != keys {
            fails.push(format!("frontends: got {got:?}, want {keys:?}"));
        }
        for (key, w) in want {
            let Some((clusters, n)) = frontends.get(key) else {
                continue;
            };
            let (wc, wn) = match w {
                FrontendExpect::Clusters(c) => (c, None),
                FrontendExpect::Detailed { clusters, backends } => (clusters, Some(*backends)),
            };
            let wc: BTreeSet<String> = wc.iter().cloned().collect();
            if *clusters != wc {
                fails.push(format!("frontend {key}: reaches {clusters:?}, want {wc:?}"));
            }
            if let Some(wn) = wn
                && wn != *n
            {
                fails.push(format!("frontend {key}: {n} backends, want {wn}"));
            }
        }
    }

    // --- diagnostics
    let diags: Vec<String> = v["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            ["file", "cluster", "object", "message"]
                .iter()
                .map(|k| s(&d[*k]))
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .collect();
    for sub in &expect.diagnostics {
        if !diags.iter().any(|d| d.contains(sub.as_str())) {
            fails.push(format!("no diagnostic contains {sub:?}; got {diags:#?}"));
        }
    }
    if let Some(n) = expect.diagnostics_count
        && diags.len() != n
    {
        fails.push(format!("{} diagnostics, want {n}: {diags:#?}", diags.len()));
    }

    fails.extend(invariants(&v, &config.cidrs));
    fails.extend(order_independent(dir, cluster.as_ref(), &v));
    fails.extend(stable_when_fed_back(dir, &plan, &json));
    fails
}

/// What holds for every plan, whatever the scenario.
fn invariants(v: &Value, cidrs: &ClusterSetCidrs) -> Vec<String> {
    let mut fails = Vec::new();
    let reason_ok = |r: &str| {
        let b = r.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphabetic()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"_,:".contains(c))
            && (b[b.len() - 1].is_ascii_alphanumeric() || b[b.len() - 1] == b'_')
    };
    let order = [
        "PortConflict",
        "IPFamilyConflict",
        "TypeConflict",
        "SessionAffinityConflict",
        "SessionAffinityConfigConflict",
        "InternalTrafficPolicyConflict",
        "TrafficDistributionConflict",
        "LabelsConflict",
        "AnnotationsConflict",
    ];
    let mut conflicts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in v["serviceExports"].as_array().into_iter().flatten() {
        for c in e["conditions"].as_array().into_iter().flatten() {
            let r = s(&c["reason"]);
            if !reason_ok(&r) {
                fails.push(format!("reason {r:?} does not match the CRD pattern"));
            }
            if c["type"] == "Conflict" {
                conflicts
                    .entry(format!("{}/{}", s(&e["namespace"]), s(&e["name"])))
                    .or_default()
                    .insert(format!("{}/{}/{}", s(&c["status"]), r, s(&c["message"])));
                if c["status"] == "True" {
                    let idx: Vec<usize> = r
                        .split(',')
                        .map(|p| order.iter().position(|o| *o == p).unwrap_or(usize::MAX))
                        .collect();
                    if idx.contains(&usize::MAX) || idx.windows(2).any(|w| w[0] >= w[1]) {
                        fails.push(format!("Conflict reason {r:?} is not in the fixed order"));
                    }
                }
            }
        }
    }
    for (svc, set) in conflicts {
        if set.len() != 1 {
            fails.push(format!("exports of {svc} disagree on Conflict: {set:?}"));
        }
    }
    let mut all_ips = BTreeSet::new();
    let mut import_names = BTreeSet::new();
    for i in v["serviceImports"].as_array().into_iter().flatten() {
        let name = format!(
            "{}/{}",
            s(&i["metadata"]["namespace"]),
            s(&i["metadata"]["name"])
        );
        import_names.insert(name.clone());
        let spec = &i["spec"];
        let fams: Vec<String> = spec["ipFamilies"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect();
        let ips: Vec<String> = spec["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect();
        if fams.is_empty() || fams.len() > 2 || (fams.len() == 2 && fams[0] == fams[1]) {
            fails.push(format!("import {name}: bad ipFamilies {fams:?}"));
        }
        let ready = i["status"]["conditions"][0]["status"] == "True";
        if spec["type"] == "Headless" && !ips.is_empty() {
            fails.push(format!("headless import {name} has ips"));
        }
        if spec["type"] == "ClusterSetIP" && ready && ips.len() != fams.len() {
            fails.push(format!(
                "import {name}: ips {ips:?} do not align with {fams:?}"
            ));
        }
        for (ip, fam) in ips.iter().zip(&fams) {
            let Ok(addr) = ip.parse::<IpAddr>() else {
                fails.push(format!("import {name}: {ip} is not an IP"));
                continue;
            };
            if IpFamily::of(&addr).to_string() != *fam {
                fails.push(format!("import {name}: {ip} is not {fam}"));
            }
            let inside = match addr {
                IpAddr::V4(a) => {
                    cidrs.ipv4.contains(&a)
                        && a != cidrs.ipv4.network()
                        && a != cidrs.ipv4.broadcast()
                }
                IpAddr::V6(a) => {
                    cidrs.ipv6.contains(&a)
                        && a != cidrs.ipv6.network()
                        && a != cidrs.ipv6.broadcast()
                }
            };
            if !inside {
                fails.push(format!("import {name}: {ip} is not a usable ClusterSet IP"));
            }
            if !all_ips.insert(ip.clone()) {
                fails.push(format!("{ip} is given to two imports"));
            }
        }
    }
    let mut slice_names = BTreeSet::new();
    for sl in v["endpointSlices"].as_array().into_iter().flatten() {
        let meta = &sl["metadata"];
        let name = s(&meta["name"]);
        let labels = &meta["labels"];
        let svc = format!(
            "{}/{}",
            s(&meta["namespace"]),
            s(&labels["multicluster.kubernetes.io/service-name"])
        );
        if !import_names.contains(&svc) {
            fails.push(format!("slice {name} belongs to no import ({svc})"));
        }
        if labels["endpointslice.kubernetes.io/managed-by"] != MANAGED_BY {
            fails.push(format!("slice {name}: managed-by label"));
        }
        if labels["multicluster.kubernetes.io/source-cluster"]
            .as_str()
            .is_none()
        {
            fails.push(format!("slice {name}: no source-cluster label"));
        }
        if name.len() > 253 || !slice_names.insert(format!("{}/{name}", s(&meta["namespace"]))) {
            fails.push(format!("slice name {name} too long or not unique"));
        }
        let eps = sl["endpoints"].as_array().cloned().unwrap_or_default();
        if eps.len() > 100 {
            fails.push(format!("slice {name} has {} endpoints", eps.len()));
        }
        for ep in eps {
            for a in ep["addresses"].as_array().into_iter().flatten() {
                match s(a).parse::<IpAddr>() {
                    Ok(ip) if IpFamily::of(&ip).to_string() == s(&sl["addressType"]) => {}
                    _ => fails.push(format!(
                        "slice {name}: address {a} vs {}",
                        sl["addressType"]
                    )),
                }
            }
        }
    }
    fails
}

/// The plan without what legitimately names files.
fn without_files(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(diags) = v["diagnostics"].as_array_mut() {
        for d in diags.iter_mut() {
            if let Some(d) = d.as_object_mut() {
                d.remove("file");
            }
        }
        diags.sort_by_key(|d| d.to_string());
    }
    v
}

fn copy_dir(from: &Path, to: &Path, mut each_file: impl FnMut(&Path, &Path, &str)) {
    for entry in std::fs::read_dir(from).expect("read dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name").to_owned();
        if path.is_dir() {
            let sub = to.join(&name);
            std::fs::create_dir_all(&sub).expect("mkdir");
            for f in std::fs::read_dir(&path).expect("read dir") {
                let f = f.expect("entry").path();
                let text = std::fs::read_to_string(&f).expect("read");
                each_file(&f, &sub, &text);
            }
        } else if name != "expect.yaml" {
            std::fs::copy(&path, to.join(&name)).expect("copy");
        }
    }
}

/// The same directory with files renamed into the reverse order and, where a file parses
/// cleanly, its documents split into files in reverse order: the plan must not change.
fn order_independent(dir: &Path, cluster: Option<&ClusterId>, v: &Value) -> Vec<String> {
    let tmp = tempfile::tempdir().expect("tempdir");
    copy_dir(dir, tmp.path(), |file, sub, text| {
        let stem = file.file_name().and_then(|n| n.to_str()).unwrap_or("x");
        let rev: String = stem
            .chars()
            .map(|c| (b'z' - (c as u8 % 26)) as char)
            .collect();
        let (_, errors) = parse_documents(text, file);
        if errors.is_empty() && !text.contains("---\n---") {
            let docs: Vec<&str> = text.split("\n---").collect();
            for (i, doc) in docs.iter().enumerate() {
                let doc = doc.trim_start_matches("---");
                std::fs::write(sub.join(format!("{rev}-{:03}.yaml", 999 - i)), doc).expect("write");
            }
        } else {
            std::fs::write(sub.join(format!("{rev}.yaml")), text).expect("write");
        }
    });
    match clusterset_dir::plan(tmp.path(), cluster) {
        Ok(p) => {
            let other: Value = serde_json::from_str(&p.to_json()).expect("json");
            if without_files(&other) != without_files(v) {
                vec!["the plan changes when files and documents are reordered".into()]
            } else {
                vec![]
            }
        }
        Err(e) => vec![format!("reordered copy fails: {e}")],
    }
}

/// Writes the produced imports into the importing cluster's directory: merging again must
/// give the same plan (IPs are sticky, nothing else depends on existing imports).
fn stable_when_fed_back(dir: &Path, p: &plan::Plan, json: &str) -> Vec<String> {
    let tmp = tempfile::tempdir().expect("tempdir");
    copy_dir(dir, tmp.path(), |file, sub, text| {
        std::fs::write(sub.join(file.file_name().expect("name")), text).expect("write");
    });
    let sub = tmp.path().join(p.merged.cluster.as_str());
    std::fs::create_dir_all(&sub).expect("mkdir");
    let docs: Vec<String> = p
        .merged
        .merge
        .service_imports
        .iter()
        .map(|si| serde_yaml::to_string(&si.to_k8s()).expect("yaml"))
        .collect();
    std::fs::write(sub.join("zz-imports.yaml"), docs.join("---\n")).expect("write");
    match clusterset_dir::plan(tmp.path(), Some(&p.merged.cluster)) {
        Ok(again) => {
            // Diagnostics name files, which now live elsewhere.
            let a = without_files(&serde_json::from_str(json).expect("json"));
            let b = without_files(&serde_json::from_str(&again.to_json()).expect("json"));
            if a == b {
                vec![]
            } else {
                vec![format!(
                    "feeding the imports back changes the plan:\n{a:#}\nvs\n{b:#}"
                )]
            }
        }
        Err(e) => vec![format!("fed-back copy fails: {e}")],
    }
}

#[test]
fn scenarios() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(scenarios_dir())
        .expect("tests/scenarios exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut failures = Vec::new();
    for dir in &dirs {
        for f in check(dir) {
            failures.push(format!(
                "{}: {f}",
                dir.file_name().and_then(|n| n.to_str()).unwrap_or("?")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Guards against the directory going missing or being emptied by accident.
    assert!(dirs.len() >= 30, "too few scenarios: {}", dirs.len());
}

/// The plan is byte-identical across runs and renders with a trailing newline.
#[test]
fn plan_json_is_deterministic() {
    let dir = scenarios_dir().join("conf02-clusterip-properties");
    let a = clusterset_dir::plan(&dir, None).expect("plan").to_json();
    let b = clusterset_dir::plan(&dir, None).expect("plan").to_json();
    assert_eq!(a, b);
    assert!(a.ends_with("}\n"));
    assert!(!a.contains("lastTransitionTime"));
}
