//! Room `loadgen`: the `--plot` SVG. Four panels readable without the JSON: the CDFs of TTFT and
//! TPOT per tenant with the SLA marked, and TTFT and TPOT of every completed request over the
//! run's time, per tenant.

use super::report::{Outcome, Report, Sample};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type Chart<'a, 'b, X, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>;

/// Renders the report's charts as an SVG document.
pub fn svg(report: &Report) -> anyhow::Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1400, 1000)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(
            &format!(
                "tokengate loadgen: {} requests, SLA TTFT <= {} ms, TPOT <= {} ms",
                report.overall.requests, report.sla.ttft_ms, report.sla.tpot_ms
            ),
            ("sans-serif", 22),
        )?;
        let (top, bottom) = root.split_vertically(490);
        let (a, b) = top.split_horizontally(700);
        let (c, d) = bottom.split_horizontally(700);
        let ttft = |s: &Sample| s.ttft_ms;
        let tpot = |s: &Sample| s.tpot_ms;
        cdf(&a, report, "TTFT CDF", ttft, report.sla.ttft_ms)?;
        cdf(&b, report, "TPOT CDF", tpot, report.sla.tpot_ms)?;
        over_time(&c, report, "TTFT over time", ttft, report.sla.ttft_ms)?;
        over_time(&d, report, "TPOT over time", tpot, report.sla.tpot_ms)?;
        root.present()?;
    }
    Ok(out)
}

fn tenants(report: &Report) -> impl Iterator<Item = (usize, &str)> {
    report.tenants.keys().map(String::as_str).enumerate()
}

fn values(
    report: &Report,
    tenant: &str,
    metric: impl Fn(&Sample) -> Option<f64>,
) -> Vec<(f64, f64)> {
    report
        .samples
        .iter()
        .filter(|s| s.tenant == tenant && s.outcome == Outcome::Ok)
        .filter_map(|s| metric(s).map(|v| (s.at_s, v.max(0.01))))
        .collect()
}

/// A log-scaled latency range covering every value and the SLA line.
fn latency_range(
    report: &Report,
    metric: &impl Fn(&Sample) -> Option<f64>,
    sla: f64,
) -> (f64, f64) {
    let all = report.samples.iter().filter_map(metric);
    let (lo, hi) = all.fold((sla, sla), |(lo, hi), v| (lo.min(v), hi.max(v)));
    ((lo * 0.8).max(0.01), hi * 1.25)
}

fn cdf(
    area: &Area,
    report: &Report,
    title: &str,
    metric: impl Fn(&Sample) -> Option<f64>,
    sla: f64,
) -> anyhow::Result<()> {
    let (lo, hi) = latency_range(report, &metric, sla);
    let mut chart = chart(
        area,
        title,
        (lo..hi).log_scale(),
        0.0..1.0,
        "ms (log)",
        "share of requests",
    )?;
    for (i, tenant) in tenants(report) {
        let mut xs: Vec<f64> = values(report, tenant, &metric)
            .into_iter()
            .map(|p| p.1)
            .collect();
        xs.sort_by(f64::total_cmp);
        let n = xs.len() as f64;
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                xs.iter().enumerate().map(|(k, &x)| (x, (k + 1) as f64 / n)),
                color.stroke_width(2),
            ))?
            .label(tenant.to_string())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(sla, 0.0), (sla, 1.0)],
        RED.stroke_width(1),
    )))?;
    legend(&mut chart)
}

fn over_time(
    area: &Area,
    report: &Report,
    title: &str,
    metric: impl Fn(&Sample) -> Option<f64>,
    sla: f64,
) -> anyhow::Result<()> {
    let (lo, hi) = latency_range(report, &metric, sla);
    // The arrival window (answers may end later, but points sit at their arrival).
    let last_arrival = report.samples.iter().map(|s| s.at_s).fold(0.0, f64::max);
    let end = (last_arrival * 1.02).max(1.0);
    let mut chart = chart(
        area,
        title,
        0.0..end,
        (lo..hi).log_scale(),
        "arrival (s)",
        "ms (log)",
    )?;
    for (i, tenant) in tenants(report) {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(
                values(report, tenant, &metric)
                    .into_iter()
                    .map(move |p| Circle::new(p, 2, color.filled())),
            )?
            .label(tenant.to_string())
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, sla), (end, sla)],
        RED.stroke_width(1),
    )))?;
    legend(&mut chart)
}

fn chart<'a, 'b, X, Y>(
    area: &'a Area<'b>,
    title: &str,
    x: X,
    y: Y,
    x_desc: &str,
    y_desc: &str,
) -> anyhow::Result<Chart<'a, 'b, X::CoordDescType, Y::CoordDescType>>
where
    X: AsRangedCoord,
    Y: AsRangedCoord,
    X::CoordDescType: ValueFormatter<X::Value>,
    Y::CoordDescType: ValueFormatter<Y::Value>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()?;
    Ok(chart)
}

fn legend<'a, 'b, X: Ranged, Y: Ranged>(chart: &mut Chart<'a, 'b, X, Y>) -> anyhow::Result<()>
where
    'b: 'a,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loadgen::report::Sla;
    use std::time::Duration;

    #[test]
    fn svg_has_four_panels_and_a_series_per_tenant() {
        let sample = |tenant: &str, at: f64, ttft: f64| Sample {
            tenant: tenant.into(),
            at_s: at,
            outcome: Outcome::Ok,
            status: 200,
            ttft_ms: Some(ttft),
            tpot_ms: Some(30.0 + at),
            e2e_ms: ttft + 300.0,
            prompt_tokens: 100,
            output_tokens: 10,
            attempts: 1,
        };
        let samples = vec![
            sample("alice", 0.5, 120.0),
            sample("alice", 1.5, 900.0),
            sample("bob", 1.0, 5000.0),
        ];
        let sla = Sla {
            ttft_ms: 800.0,
            tpot_ms: 50.0,
        };
        let svg = svg(&Report::new(samples, Duration::from_secs(3), sla)).unwrap();
        assert!(svg.starts_with("<svg"));
        for title in ["TTFT CDF", "TPOT CDF", "TTFT over time", "TPOT over time"] {
            assert!(svg.contains(title), "{title}");
        }
        // Each tenant is named in the legend of every panel.
        assert_eq!(svg.matches(">\nalice\n</text>").count(), 4);
        assert_eq!(svg.matches(">\nbob\n</text>").count(), 4);
    }
}
