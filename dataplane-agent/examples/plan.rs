//! Prints the plan of a ClusterSet directory: `cargo run --example plan -- DIR [CLUSTER]`.
//! (The CLI's `plan` subcommand does the same; this example needs no CLI wiring.)

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: plan DIR [CLUSTER]"))?;
    let cluster = args
        .next()
        .map(dataplane_core::model::ClusterId::new)
        .transpose()?;
    let plan = dataplane_agent::source::clusterset_dir::plan(dir.as_ref(), cluster.as_ref())?;
    print!("{}", plan.to_json());
    Ok(())
}
