//! `dataplane-agent uninstall` (root): refused while an agent runs on the pin directory,
//! detaches the programs and removes the pins once it has stopped, and is a no-op when run
//! again.

use std::{process::Command, time::Duration};

use tests::{
    agent::{Agent, frontend, one_service_yaml},
    netns::{Topology, agent_bin},
    require_root,
};

fn uninstall(topo: &Topology) -> (bool, String) {
    let out = Command::new(agent_bin())
        .args(["uninstall", "--pin-dir", topo.pin_dir.to_str().unwrap()])
        .output()
        .expect("run uninstall");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn uninstall_waits_for_the_agent_then_removes_everything_and_is_idempotent() {
    require_root!();
    let topo = Topology::new(&["a"]).unwrap();
    topo.write_fixture(
        "input",
        "a.yaml",
        &one_service_yaml("a", "241.0.0.80", &[10]),
    )
    .unwrap();
    let input = topo.dir.join("input");
    let mut agent = Agent::start(&topo, &["node", "--from-dir", input.to_str().unwrap()]).unwrap();
    agent
        .wait_for("service a", Duration::from_secs(20), |i| {
            frontend(i, "241.0.0.80", 80, "TCP").is_some()
        })
        .unwrap();
    let programs = topo.attached_programs().values().sum::<usize>();
    assert!(programs > 0);

    let (ok, text) = uninstall(&topo);
    assert!(!ok, "{text}");
    assert!(
        text.contains("an agent is running on this pin directory; stop it first"),
        "{text}"
    );
    assert!(topo.pin_dir.join("maps").exists(), "nothing was removed");
    assert_eq!(topo.attached_programs().values().sum::<usize>(), programs);
    assert!(agent.running());

    // The agent stops and leaves the dataplane in place; uninstall then removes it.
    agent.kill(libc::SIGTERM);
    assert_eq!(
        topo.attached_programs().values().sum::<usize>(),
        programs,
        "the dataplane stays after SIGTERM"
    );
    let (ok, text) = uninstall(&topo);
    assert!(ok, "{text}");
    assert!(text.starts_with("removed "), "{text}");
    assert!(!topo.pin_dir.exists(), "{text}");
    assert_eq!(
        topo.attached_programs().values().sum::<usize>(),
        0,
        "the programs are detached"
    );

    let (ok, text) = uninstall(&topo);
    assert!(ok, "{text}");
    assert!(text.contains("nothing installed under"), "{text}");
}
