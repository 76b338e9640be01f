//! The GenAI server metrics (`gen_ai.server.request.duration`, `time_to_first_token`,
//! `time_per_output_token`): cumulative histograms on the semantic conventions' recommended
//! bucket boundaries, one series per operation, model and error type, read whole at each export.
//!
//! A series' attributes come from a fixed set (the routes' operations, the served model names a
//! request must name to be counted, the gateway's error codes), so the series stay few.

use super::attribute::string;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{
    metric::Data, AggregationTemporality, Histogram, HistogramDataPoint, Metric,
};
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// One of the three instruments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Instrument {
    /// `gen_ai.server.request.duration`: from the request's arrival to its end.
    Duration,
    /// `gen_ai.server.time_to_first_token`.
    TimeToFirstToken,
    /// `gen_ai.server.time_per_output_token`: the mean gap after the first token.
    TimePerOutputToken,
}

impl Instrument {
    const ALL: [Instrument; 3] = [
        Instrument::Duration,
        Instrument::TimeToFirstToken,
        Instrument::TimePerOutputToken,
    ];

    fn name(self) -> &'static str {
        match self {
            Instrument::Duration => "gen_ai.server.request.duration",
            Instrument::TimeToFirstToken => "gen_ai.server.time_to_first_token",
            Instrument::TimePerOutputToken => "gen_ai.server.time_per_output_token",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Instrument::Duration => "Generative AI server request duration such as time-to-last byte or last output token.",
            Instrument::TimeToFirstToken => "Time to generate first token for successful responses.",
            Instrument::TimePerOutputToken => "Time per output token generated after the first token for successful responses.",
        }
    }

    /// The semantic conventions' recommended boundaries, in seconds.
    fn bounds(self) -> &'static [f64] {
        match self {
            Instrument::Duration => &[
                0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                81.92,
            ],
            Instrument::TimeToFirstToken => &[
                0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0,
            ],
            Instrument::TimePerOutputToken => &[
                0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
            ],
        }
    }
}

/// The attributes of a series.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Series {
    /// `gen_ai.operation.name`.
    pub operation: &'static str,
    /// `gen_ai.request.model`, once the request named a served model.
    pub model: Option<String>,
    /// `error.type`, when the request failed.
    pub error: Option<&'static str>,
}

impl Series {
    pub(super) fn attributes(&self) -> Vec<KeyValue> {
        let mut out = vec![string("gen_ai.operation.name", self.operation)];
        if let Some(model) = &self.model {
            out.push(string("gen_ai.request.model", model));
        }
        if let Some(error) = self.error {
            out.push(string("error.type", error));
        }
        out
    }
}

/// One series' counts so far.
#[derive(Debug)]
struct Counts {
    buckets: Vec<u64>,
    sum: f64,
    min: f64,
    max: f64,
}

/// The three instruments' series.
#[derive(Debug, Default)]
pub(super) struct Histograms {
    series: Mutex<BTreeMap<(Instrument, Series), Counts>>,
}

impl Histograms {
    /// Counts `value` in `instrument`'s `series`.
    pub(super) fn observe(&self, instrument: Instrument, series: &Series, value: Duration) {
        let seconds = value.as_secs_f64();
        let bounds = instrument.bounds();
        let mut all = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = (all.entry((instrument, series.clone()))).or_insert_with(|| Counts {
            buckets: vec![0; bounds.len() + 1],
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        });
        // OTLP's buckets are upper-inclusive: bucket i holds bounds[i-1] < v <= bounds[i].
        let bucket = bounds.partition_point(|&b| b < seconds);
        counts.buckets[bucket] += 1;
        counts.sum += seconds;
        counts.min = counts.min.min(seconds);
        counts.max = counts.max.max(seconds);
    }

    /// Every instrument with its series so far, cumulative from `start` (Unix nanoseconds) to
    /// `now`; an instrument nothing was counted in is left out.
    pub(super) fn metrics(&self, start: u64, now: u64) -> Vec<Metric> {
        let all = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        (Instrument::ALL.into_iter())
            .filter_map(|instrument| {
                let data_points: Vec<HistogramDataPoint> = (all.iter())
                    .filter(|((i, _), _)| *i == instrument)
                    .map(|((_, series), c)| HistogramDataPoint {
                        attributes: series.attributes(),
                        start_time_unix_nano: start,
                        time_unix_nano: now,
                        count: c.buckets.iter().sum(),
                        sum: Some(c.sum),
                        bucket_counts: c.buckets.clone(),
                        explicit_bounds: instrument.bounds().to_vec(),
                        min: Some(c.min),
                        max: Some(c.max),
                        ..Default::default()
                    })
                    .collect();
                (!data_points.is_empty()).then(|| Metric {
                    name: instrument.name().to_owned(),
                    description: instrument.description().to_owned(),
                    unit: "s".to_owned(),
                    data: Some(Data::Histogram(Histogram {
                        data_points,
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    })),
                    ..Default::default()
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_fall_in_upper_inclusive_buckets_and_stay_cumulative() {
        let h = Histograms::default();
        let chat = Series {
            operation: "chat",
            model: Some("m".to_owned()),
            error: None,
        };
        for ms in [0, 10, 11, 100_000] {
            h.observe(Instrument::Duration, &chat, Duration::from_millis(ms));
        }
        let metrics = h.metrics(1, 2);
        assert_eq!(metrics.len(), 1);
        let Some(Data::Histogram(hist)) = &metrics[0].data else {
            panic!("a histogram");
        };
        let point = &hist.data_points[0];
        let mut expected = vec![0; 15];
        (expected[0], expected[1], expected[14]) = (2, 1, 1);
        assert_eq!(point.bucket_counts, expected);
        assert_eq!(
            (point.count, point.min, point.max),
            (4, Some(0.0), Some(100.0))
        );
        assert_eq!((point.start_time_unix_nano, point.time_unix_nano), (1, 2));
        h.observe(Instrument::Duration, &chat, Duration::from_millis(5));
        let again = h.metrics(1, 3);
        let Some(Data::Histogram(hist)) = &again[0].data else {
            panic!("a histogram");
        };
        assert_eq!(hist.data_points[0].count, 5);
    }
}
