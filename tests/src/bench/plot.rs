//! `target/bench/datapath.png`: TCP connections per second and p99 latency against N, per mode.

use std::path::Path;

use anyhow::{Context as _, anyhow};
use plotters::prelude::*;

use super::datapath::{Mode, Proto, Throughput};

/// Where Debian's fonts-dejavu-core puts the font (`cargo xtask setup` installs it).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn register_font() -> anyhow::Result<()> {
    static REGISTERED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT)
                .map_err(|e| format!("{FONT}: {e} (install fonts-dejavu-core)"))?;
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{FONT} is not a usable font"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

fn color(mode: Mode) -> RGBColor {
    match mode {
        Mode::SocketLb => RGBColor(0x1f, 0x77, 0xb4),
        Mode::Iptables => RGBColor(0xd6, 0x27, 0x28),
        Mode::Nftables => RGBColor(0xff, 0x7f, 0x0e),
        Mode::Direct => RGBColor(0x2c, 0xa0, 0x2c),
    }
}

/// Draws both panels of the TCP rows into `path` (PNG).
pub fn datapath(path: &Path, results: &[Throughput]) -> anyhow::Result<()> {
    register_font()?;
    let tcp: Vec<Throughput> = results
        .iter()
        .filter(|t| t.proto == Proto::Tcp)
        .cloned()
        .collect();
    let results = &tcp[..];
    let root = BitMapBackend::new(path, (1200, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let (left, right) = root.split_horizontally(600);
    panel(&left, results, "connections per second", |t| {
        t.conns_per_sec
    })?;
    panel(&right, results, "p99 latency (µs)", |t| t.p99_us)?;
    root.present()
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("writing {}", path.display()))
}

fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    results: &[Throughput],
    title: &str,
    value: impl Fn(&Throughput) -> f64,
) -> anyhow::Result<()> {
    let max_n = results
        .iter()
        .map(|t| t.services)
        .max()
        .unwrap_or(1)
        .max(10) as f64;
    let max_y = results.iter().map(&value).fold(1.0_f64, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((1.0..max_n * 1.5).log_scale(), 0.0..max_y)
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("installed services (N, log scale)")
        .x_label_formatter(&|n| format!("{n:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    for mode in [Mode::SocketLb, Mode::Iptables, Mode::Nftables, Mode::Direct] {
        let mut points: Vec<(f64, f64)> = results
            .iter()
            .filter(|t| t.mode == mode && t.skipped.is_none())
            .map(|t| ((t.services.max(1)) as f64, value(t)))
            .collect();
        if points.is_empty() {
            continue;
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let c = color(mode);
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
            .map_err(|e| anyhow!("{e}"))?
            .label(mode.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 4, c.filled())))
            .map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::LowerLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
