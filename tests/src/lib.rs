//! Test support for the MCS dataplane: network-namespace topologies, the agent process, and
//! the probe client's reports. The tests themselves live in `tests/tests/`.

pub mod agent;
pub mod netns;
pub mod probe;
