//! `kiln plot`: the curves of a log folder as one SVG, panels stacked on a
//! shared step axis, so a loss that stalls can be read against the lr and
//! the gradient norm of the same steps (a too-high lr shows as a loss that
//! jumps with a large grad norm; a saturated activation as a loss that
//! stalls with a vanishing one).
//!
//! ```
//! # let dir = std::env::temp_dir().join(format!("kiln-plot-doc-{}", std::process::id()));
//! let mut w = kiln::tensorboard::SummaryWriter::new(&dir).unwrap();
//! for s in 1..=10 { w.add_scalar("train/loss", 1.0 / s as f64, s).unwrap(); }
//! w.flush().unwrap();
//! let svg = dir.join("curves.svg");
//! let drawn = kiln::plot::plot(&dir, &svg).unwrap();
//! assert_eq!(drawn, vec!["train/loss".to_string()]);
//! assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

use crate::tensorboard::{read_scalars, Scalar};
use crate::{Error, Result};
use plotters::prelude::*;
use std::path::Path;

/// The panels, top to bottom: per-step curves on the step axis, then the
/// per-epoch accuracies on the epoch axis (each only if the log has it).
pub const PANELS: [(&str, &[&str]); 5] = [
    ("loss", &["train/loss"]),
    ("learning rate", &["train/lr"]),
    ("gradient norm (before clipping)", &["train/grad_norm"]),
    ("samples / s", &["train/samples_per_sec"]),
    (
        "accuracy per epoch",
        &["epoch/train_accuracy", "epoch/test_accuracy"],
    ),
];

const COLORS: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(214, 39, 40)];

fn plot_err(path: &Path, msg: impl ToString) -> Error {
    Error::Io {
        path: path.display().to_string(),
        msg: msg.to_string(),
    }
}

/// Draws the curves of `logdir` into the SVG file `out` (written
/// atomically); returns the tags drawn. A folder without any of the
/// [`PANELS`] tags is an error listing the tags it has.
pub fn plot(logdir: &Path, out: &Path) -> Result<Vec<String>> {
    let curves = read_scalars(logdir)?;
    let panels: Vec<(&str, Vec<(&str, &Vec<Scalar>)>)> = PANELS
        .iter()
        .map(|(title, tags)| {
            let have = tags
                .iter()
                .filter_map(|t| curves.get(*t).filter(|c| !c.is_empty()).map(|c| (*t, c)))
                .collect::<Vec<_>>();
            (*title, have)
        })
        .filter(|(_, have)| !have.is_empty())
        .collect();
    if panels.is_empty() {
        let tags: Vec<&str> = curves.keys().map(String::as_str).collect();
        return Err(plot_err(
            logdir,
            format!("none of kiln train's tags (train/loss, ...) in the event files; they hold: {tags:?}"),
        ));
    }
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (960, 260 * panels.len() as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(out, e))?;
        let areas = root.split_evenly((panels.len(), 1));
        for ((title, series), area) in panels.iter().zip(&areas) {
            draw_panel(area, title, series).map_err(|e| plot_err(out, e))?;
        }
        root.present().map_err(|e| plot_err(out, e))?;
    }
    let tmp = out.with_extension("svg.tmp");
    std::fs::write(&tmp, svg).map_err(|e| plot_err(&tmp, e))?;
    std::fs::rename(&tmp, out).map_err(|e| plot_err(out, e))?;
    Ok(panels
        .iter()
        .flat_map(|(_, s)| s.iter().map(|(t, _)| t.to_string()))
        .collect())
}

/// A tick label: plain for ordinary magnitudes, scientific for tiny or huge ones.
fn tick(v: &f64) -> String {
    match v.abs() {
        0.0 => "0".into(),
        a if (1e-2..1e4).contains(&a) => format!("{v:.3}"),
        _ => format!("{v:.2e}"),
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_panel(
    area: &Area<'_>,
    title: &str,
    series: &[(&str, &Vec<Scalar>)],
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let pts = series.iter().flat_map(|(_, c)| c.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (i64::MAX, i64::MIN, f64::INFINITY, f64::NEG_INFINITY);
    for p in pts {
        x0 = x0.min(p.step);
        x1 = x1.max(p.step);
        if p.value.is_finite() {
            y0 = y0.min(p.value as f64);
            y1 = y1.max(p.value as f64);
        }
    }
    if !y0.is_finite() {
        (y0, y1) = (0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(y1.abs() * 1e-3).max(1e-9);
    let x_label = if title.contains("epoch") {
        "epoch"
    } else {
        "step"
    };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(x0 as f64..(x1.max(x0 + 1)) as f64, (y0 - pad)..(y1 + pad))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .x_labels(match x_label {
            "epoch" => ((x1 - x0) as usize + 1).min(12),
            _ => 10,
        })
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&tick)
        .draw()?;
    for (i, (tag, c)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let line = c
            .iter()
            .filter(|p| p.value.is_finite())
            .map(|p| (p.step as f64, p.value as f64));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))?
            .label(*tag)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
