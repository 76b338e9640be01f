//! The decode floor: what a request the backend ran and never answered stays charged for its
//! output. Its prompt's prefill is spent once it is forwarded, and a running sequence makes at
//! least a token per TPOT target, so giving back every reserved decode token of a request whose
//! client left (or which the gateway stopped waiting for) would make decode free.

use std::time::Duration;
use tokio::time::Instant;

/// The least decode a backend did for a request it ran and never answered (its client left,
/// or the gateway stopped waiting: a 504): each sequence one token per `tpot`, once the
/// prompt's prefill (`prefill_per_token` each) is done, capped at the reservation. Refunding
/// all of it let a tenant run decode for the price of its prompts (`n` sequences of
/// `max_tokens` each, the client gone before the answer).
///
/// `tpot` is the backend's TPOT target (`backends[].tpot_slo_ms`, 50 ms unless given: the
/// capacity model's default), which the backend's batch is sized to stay under, so a sequence
/// it runs makes at least one token in that time. `prefill_per_token` is the capacity model's
/// prefill time of a prompt token for a backend it sizes (`hardware` + `model`); none is known
/// otherwise, and then none is set aside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeFloor {
    /// The time in which a running sequence makes at least one token.
    pub tpot: Duration,
    /// The prefill time of one prompt token, set aside before decode begins.
    pub prefill_per_token: Duration,
}

impl DecodeFloor {
    /// `backend`'s floor (see the type's doc).
    pub fn of(backend: &crate::config::BackendConfig) -> Self {
        let tpot_ms =
            (backend.tpot_slo_ms).unwrap_or(crate::capacity::DEFAULT_TPOT_SLO_SECONDS * 1e3);
        let prefill_per_token = backend.derived.as_ref().map_or(0.0, |d| {
            let r = &d.per_replica;
            r.ttft_ms / 1e3 / r.input_tokens.max(1) as f64
        });
        Self {
            tpot: Duration::from_secs_f64(tpot_ms / 1e3),
            prefill_per_token: Duration::try_from_secs_f64(prefill_per_token).unwrap_or_default(),
        }
    }

    /// The decode tokens `sequences` of a prompt of `prompt` tokens made at least in `ran`,
    /// at most `reserved`.
    pub fn tokens(&self, sequences: u64, prompt: u64, ran: Duration, reserved: u64) -> u64 {
        let prefill =
            (self.prefill_per_token).saturating_mul(u32::try_from(prompt).unwrap_or(u32::MAX));
        let decoding = ran.saturating_sub(prefill).as_nanos();
        let each = decoding / self.tpot.as_nanos().max(1);
        sequences
            .saturating_mul(u64::try_from(each).unwrap_or(u64::MAX))
            .min(reserved)
    }
}

/// A request on its way to the backend: what its decode floor is counted from.
#[derive(Clone, Copy, Debug)]
pub(super) struct Running {
    pub(super) floor: DecodeFloor,
    pub(super) sequences: u64,
    pub(super) since: Instant,
}

impl Running {
    /// The decode tokens it made at least by now, for a prompt of `prompt` tokens, at most
    /// `reserved`.
    pub(super) fn decode(&self, prompt: u64, reserved: u64) -> u64 {
        (self.floor).tokens(self.sequences, prompt, self.since.elapsed(), reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::DecodeFloor;
    use std::time::Duration;

    /// 50 ms a token, 1 ms of prefill a prompt token: 4 sequences of a 1,000-token prompt that
    /// ran 3.05 s decoded 41 tokens each after their 1 s prefill; capped at the reservation;
    /// none within the prefill; and no overflow at the extremes.
    #[test]
    fn the_decode_floor_counts_whole_tokens_per_sequence_after_the_prefill() {
        let floor = DecodeFloor {
            tpot: Duration::from_millis(50),
            prefill_per_token: Duration::from_millis(1),
        };
        let ran = Duration::from_millis(3050);
        assert_eq!(floor.tokens(4, 1000, ran, 8000), 4 * 41);
        assert_eq!(floor.tokens(4, 1000, ran, 100), 100);
        assert_eq!(floor.tokens(4, 1000, Duration::from_millis(999), 8000), 0);
        assert_eq!(
            floor.tokens(4, u64::MAX, Duration::from_secs(3600), 8000),
            0
        );
        assert_eq!(floor.tokens(u64::MAX, 0, Duration::MAX, 8000), 8000);
    }
}
