//! Limiter room, local-first slices (`[limiter] local_first`): this replica's slices of its
//! tenants' budgets, leased from the shared store. A charge the slice covers is taken here,
//! with no round trip; one it does not cover claims what the slice holds, and the store's
//! script takes the rest (the need) plus a top-up back to one slice, all-or-nothing, from the
//! shared buckets. Refunds go back to the slice; whatever a refund lifts above one slice, and
//! a slice left untouched for `return_after`, is given back to the shared buckets.
//!
//! No overshoot: every token admitted here was taken from the shared buckets first, and a
//! slice gives back only what it holds. The price is capacity held idle: at most one slice per
//! tenant and bucket (exported as `tokengate_limiter_slice_held_tokens{tenant,bucket}`).
//!
//! This file is the accounting only (pure, under one lock per tenant); the round trips are
//! [`super::redis`]'s.

use super::bucket::{BucketKind, TenantLimits, TenantSnapshot, TenantState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// `{tenant, bucket}`: the labels of every per-bucket series (the limiter's, and the
/// gateway's in `crate::metrics`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BucketLabels {
    /// Tenant name.
    pub tenant: String,
    /// `prefill`, `decode` or `requests`.
    pub bucket: String,
}

/// Units (10^-12 token) per bucket, in [`BucketKind::ALL`] order.
pub(crate) type Units = [u128; 3];

/// Tokens of one tenant's slice held here and not spent, by tenant and bucket.
pub type SliceHeld = Family<BucketLabels, Gauge<f64, AtomicU64>>;

/// What a slice holds, and what the headers are made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SliceState {
    /// Leased from the shared buckets and not spent.
    held: Units,
    /// One slice of each bucket (`slice` x its capacity at the last lease): what a top-up
    /// fills up to and a refund may lift to.
    target: Units,
    /// The shared levels after the last lease, and when: with `held`, the view the
    /// `x-ratelimit-*` headers show between leases.
    seen: Units,
    seen_at: Instant,
    /// Whether `seen` was ever read from the shared buckets (a slice never leased answers
    /// nothing here, not even a peek of nothing).
    leased: bool,
    /// Last charge or refund: a slice untouched for `return_after` goes back.
    touched: Instant,
}

/// What a charge the slice does not cover asks of the shared buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shortfall {
    /// What the slice held before the claim: with the shared levels, what a refusal is
    /// decided on.
    pub before: Units,
    /// Taken out of the slice for this charge (given back if the charge fails).
    pub claimed: Units,
    /// The least the script must take: the cost beyond `claimed`.
    pub need: Units,
    /// The most it takes: `need` plus what fills the slice back to its target.
    pub want: Units,
}

/// Whether `held` holds `cost` in every bucket.
pub(crate) fn covers(held: &Units, cost: &Units) -> bool {
    held.iter().zip(cost).all(|(h, c)| h >= c)
}

/// `a + b`, bucket by bucket.
pub(crate) fn plus(a: &Units, b: &Units) -> Units {
    std::array::from_fn(|i| a[i].saturating_add(b[i]))
}

impl SliceState {
    fn new(now: Instant) -> Self {
        Self {
            held: [0; 3],
            target: [0; 3],
            seen: [0; 3],
            seen_at: now,
            leased: false,
            touched: now,
        }
    }

    /// Whether `cost` can be decided here: the slice was leased and holds it.
    pub(crate) fn covers(&self, cost: &Units) -> bool {
        self.leased && covers(&self.held, cost)
    }

    /// Takes `cost` from the slice if it covers every bucket.
    pub(crate) fn take(&mut self, cost: &Units, now: Instant) -> bool {
        if !self.covers(cost) {
            return false;
        }
        for (h, c) in self.held.iter_mut().zip(cost) {
            *h -= c;
        }
        self.touched = now;
        true
    }

    /// The slice does not cover `cost`: claims what it holds of it, and says what the shared
    /// buckets must give (`need`) and may give (`want`, up to one slice, `target`, more).
    pub(crate) fn claim(&mut self, cost: &Units, target: Units) -> Shortfall {
        self.target = target;
        let before = self.held;
        let claimed: Units = std::array::from_fn(|i| self.held[i].min(cost[i]));
        let need: Units = std::array::from_fn(|i| cost[i] - claimed[i]);
        for (h, c) in self.held.iter_mut().zip(&claimed) {
            *h -= c;
        }
        let want = std::array::from_fn(|i| need[i] + target[i].saturating_sub(self.held[i]));
        Shortfall {
            before,
            claimed,
            need,
            want,
        }
    }

    /// The shared buckets, at `levels` (before the lease), gave `min(levels, want)`: the need
    /// is spent, the rest joins the slice.
    pub(crate) fn leased(&mut self, short: &Shortfall, levels: &Units, now: Instant) {
        for (i, &level) in levels.iter().enumerate() {
            let took = level.min(short.want[i]);
            self.held[i] += took - short.need[i];
            self.seen[i] = level - took;
        }
        self.seen_at = now;
        self.leased = true;
        self.touched = now;
    }

    /// The shared buckets refused (or could not be asked): the claim goes back.
    fn unclaim(&mut self, short: &Shortfall) {
        for (h, c) in self.held.iter_mut().zip(&short.claimed) {
            *h += c;
        }
    }

    /// A reservation charged from this slice gives `back`; what lifts the slice above its
    /// target is returned (to be given back to the shared buckets).
    pub(crate) fn refund(&mut self, back: &Units, now: Instant) -> Units {
        let mut excess = [0; 3];
        for (i, &back) in back.iter().enumerate() {
            let held = self.held[i] + back;
            self.held[i] = held.min(self.target[i]);
            excess[i] = held - self.held[i];
        }
        self.touched = now;
        excess
    }

    /// Empties a slice untouched since `now - idle`: what it held, to give back.
    pub(crate) fn expire(&mut self, now: Instant, idle: Duration) -> Option<Units> {
        if now.saturating_duration_since(self.touched) < idle || self.held == [0; 3] {
            return None;
        }
        Some(std::mem::take(&mut self.held))
    }

    /// What was spent since the last lease is not known here (other replicas charge the
    /// shared buckets too): the view is the shared levels after the last lease, refilled to
    /// `now`, plus what the slice holds.
    pub(crate) fn view(&self, limits: &TenantLimits, now: Instant) -> TenantSnapshot {
        let levels = std::array::from_fn(|i| self.seen[i].saturating_add(self.held[i]));
        TenantState::at_levels(levels, self.seen_at).snapshot(limits, now)
    }

    pub(crate) fn held(&self) -> Units {
        self.held
    }
}

/// One slice of each bucket of `limits`: `fraction` of its capacity, in units.
pub(crate) fn target(limits: &TenantLimits, fraction: f64) -> Units {
    limits
        .units()
        .map(|u| (u.capacity as f64 * fraction).floor() as u128)
}

/// One tenant's slice on this replica.
pub(crate) struct TenantSlice {
    state: Mutex<SliceState>,
    /// One lease at a time per tenant: charges the slice does not cover wait for the lease in
    /// flight and then take from it, so concurrent requests do not each lease a slice.
    pub(crate) leasing: tokio::sync::Mutex<()>,
    gauges: [Gauge<f64, AtomicU64>; 3],
}

impl TenantSlice {
    /// Its state, under its lock. The gauges are set again from it when the guard goes.
    pub(crate) fn lock(&self) -> SliceGuard<'_> {
        SliceGuard {
            state: self.state.lock().unwrap_or_else(PoisonError::into_inner),
            gauges: &self.gauges,
        }
    }
}

impl TenantSlice {
    /// Claims for `cost` what the slice holds of it ([`SliceState::claim`]) while the shared
    /// buckets are asked for the rest.
    pub(crate) fn claim(&self, cost: &Units, target: Units) -> Claim<'_> {
        let short = self.lock().claim(cost, target);
        Claim {
            slice: self,
            short,
            landed: false,
        }
    }
}

/// A charge's claim on its slice while its lease is in flight: it goes back to the slice when
/// dropped (the shared buckets refused, the call failed, or the request was cancelled during
/// the round trip) unless [`Claim::leased`] took it.
pub(crate) struct Claim<'a> {
    slice: &'a TenantSlice,
    pub(crate) short: Shortfall,
    landed: bool,
}

impl<'a> Claim<'a> {
    /// The lease landed: the shared buckets, at `levels` before it, gave what
    /// [`SliceState::leased`] says; the slice, locked.
    pub(crate) fn leased(mut self, levels: &Units, now: Instant) -> SliceGuard<'a> {
        self.landed = true;
        let mut s = self.slice.lock();
        s.leased(&self.short, levels, now);
        s
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.landed {
            self.slice.lock().unclaim(&self.short);
        }
    }
}

/// A slice's state, locked; dropping it exports what the slice holds.
pub(crate) struct SliceGuard<'a> {
    state: MutexGuard<'a, SliceState>,
    gauges: &'a [Gauge<f64, AtomicU64>; 3],
}

impl std::ops::Deref for SliceGuard<'_> {
    type Target = SliceState;
    fn deref(&self) -> &SliceState {
        &self.state
    }
}

impl std::ops::DerefMut for SliceGuard<'_> {
    fn deref_mut(&mut self) -> &mut SliceState {
        &mut self.state
    }
}

impl Drop for SliceGuard<'_> {
    fn drop(&mut self) {
        for (gauge, held) in self.gauges.iter().zip(self.state.held) {
            gauge.set(tokens(held));
        }
    }
}

fn tokens(units: u128) -> f64 {
    units as f64 / super::bucket::UNITS_PER_TOKEN as f64
}

/// Every tenant's slice on this replica.
pub(crate) struct Slices {
    pub(crate) fraction: f64,
    pub(crate) return_after: Duration,
    tenants: Mutex<HashMap<String, Arc<TenantSlice>>>,
    held: SliceHeld,
}

impl Slices {
    pub(crate) fn new(fraction: f64, return_after: Duration, held: SliceHeld) -> Self {
        Self {
            fraction,
            return_after,
            tenants: Mutex::default(),
            held,
        }
    }

    fn tenants(&self) -> MutexGuard<'_, HashMap<String, Arc<TenantSlice>>> {
        // Inserts and removes of whole entries cannot be left half done.
        self.tenants.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The tenant's slice (an empty one the first time).
    pub(crate) fn tenant(&self, tenant: &str, now: Instant) -> Arc<TenantSlice> {
        let mut tenants = self.tenants();
        if let Some(slice) = tenants.get(tenant) {
            return slice.clone();
        }
        let gauge = |kind: BucketKind| {
            self.held
                .get_or_create(&BucketLabels {
                    tenant: tenant.to_string(),
                    bucket: kind.as_str().to_string(),
                })
                .clone()
        };
        let slice = Arc::new(TenantSlice {
            state: Mutex::new(SliceState::new(now)),
            leasing: tokio::sync::Mutex::new(()),
            gauges: BucketKind::ALL.map(gauge),
        });
        tenants.insert(tenant.to_string(), slice.clone());
        slice
    }

    /// Drops the tenant's slice (a reload removed it): what it held is not given back (the
    /// tenant's shared buckets go too).
    pub(crate) fn forget(&self, tenant: &str) {
        if let Some(slice) = self.tenants().remove(tenant) {
            std::mem::take(&mut slice.lock().held);
        }
    }

    /// Empties the slices untouched for `idle` (zero: every slice): what each held, to give
    /// back.
    pub(crate) fn expire(&self, now: Instant, idle: Duration) -> Vec<(String, Units)> {
        let tenants: Vec<_> = (self.tenants().iter())
            .map(|(t, s)| (t.clone(), s.clone()))
            .collect();
        tenants
            .into_iter()
            .filter_map(|(tenant, slice)| {
                let held = slice.lock().expire(now, idle)?;
                Some((tenant, held))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::bucket::fixtures::limits;
    use crate::limiter::bucket::UNITS_PER_TOKEN;

    const T: u128 = UNITS_PER_TOKEN;

    fn units(p: u128, d: u128, r: u128) -> Units {
        [p * T, d * T, r * T]
    }

    #[test]
    fn a_slice_is_a_fraction_of_each_capacity() {
        // Capacities 1,000 prefill, 100 decode, 5 requests.
        assert_eq!(target(&limits(), 0.1), [100 * T, 10 * T, T / 2]);
        assert_eq!(target(&limits(), 1.0), units(1000, 100, 5));
    }

    #[test]
    fn a_charge_the_slice_covers_is_taken_here_and_one_it_does_not_changes_nothing() {
        let now = Instant::now();
        let mut s = SliceState::new(now);
        assert!(!s.take(&units(1, 1, 1), now));
        assert!(!s.take(&[0; 3], now), "never leased: nothing is known here");
        s.leased = true;
        assert!(s.take(&[0; 3], now));
        s.held = units(10, 10, 1);
        assert!(s.take(&units(4, 10, 1), now));
        assert_eq!(s.held, units(6, 0, 0));
        assert!(!s.take(&units(1, 1, 0), now), "decode is spent");
        assert_eq!(s.held, units(6, 0, 0));
    }

    #[test]
    fn a_lease_takes_the_need_and_fills_the_slice_to_its_target() {
        let t0 = Instant::now();
        let mut s = SliceState::new(t0);
        s.held = units(30, 2, 0);
        let target = units(100, 10, 1);
        let short = s.claim(&units(10, 5, 1), target);
        assert_eq!(short.claimed, units(10, 2, 0));
        assert_eq!(short.need, units(0, 3, 1));
        // What is left (20, 0, 0) is filled back to the target, beyond the need.
        assert_eq!(short.want, units(80, 13, 2));
        assert_eq!(s.held, units(20, 0, 0));
        // The shared buckets hold plenty: the slice is at its target after the charge.
        let t1 = t0 + Duration::from_secs(1);
        s.leased(&short, &units(500, 50, 5), t1);
        assert_eq!(s.held, target);
        assert_eq!(s.seen, units(420, 37, 3));
        assert_eq!((s.seen_at, s.touched), (t1, t1));
    }

    #[test]
    fn a_lease_takes_no_more_than_the_shared_levels() {
        let now = Instant::now();
        let mut s = SliceState::new(now);
        let short = s.claim(&units(10, 5, 1), units(100, 10, 1));
        assert_eq!(short.want, units(110, 15, 2));
        // Decode has 7 left: the need (5) and 2 of the top-up; requests exactly the need.
        s.leased(&short, &units(500, 7, 1), now);
        assert_eq!(s.held, units(100, 2, 0));
        assert_eq!(s.seen, units(390, 0, 0));
    }

    #[test]
    fn a_claim_goes_back_when_dropped_unless_its_lease_landed() {
        let now = Instant::now();
        let slices = Slices::new(0.1, Duration::from_secs(5), SliceHeld::default());
        let slice = slices.tenant("t", now);
        slice.lock().held = units(30, 2, 0);
        // Refused, failed, or the request cancelled during the round trip: all dropped.
        let claim = slice.claim(&units(10, 5, 1), units(100, 10, 1));
        assert_eq!(slice.lock().held, units(20, 0, 0));
        assert_eq!(claim.short.before, units(30, 2, 0));
        drop(claim);
        assert_eq!(slice.lock().held, units(30, 2, 0));
        let claim = slice.claim(&units(10, 5, 1), units(100, 10, 1));
        assert_eq!(
            claim.leased(&units(500, 50, 5), now).held,
            units(100, 10, 1)
        );
        assert_eq!(slice.lock().held, units(100, 10, 1));
    }

    #[test]
    fn refunds_go_to_the_slice_up_to_its_target_and_the_excess_goes_back() {
        let now = Instant::now();
        let mut s = SliceState::new(now);
        let short = s.claim(&units(0, 10, 0), units(100, 10, 1));
        s.leased(&short, &units(1000, 100, 5), now);
        assert_eq!(s.held, units(100, 10, 1));
        assert!(s.take(&units(0, 10, 1), now));
        assert_eq!(s.refund(&units(0, 6, 0), now), [0; 3]);
        assert_eq!(s.held, units(100, 6, 0));
        // A refund of an older reservation lifts decode past one slice: the excess goes back.
        assert_eq!(s.refund(&units(0, 9, 0), now), units(0, 5, 0));
        assert_eq!(s.held, units(100, 10, 0));
    }

    #[test]
    fn an_idle_slice_expires_whole_and_a_used_one_stays() {
        let t0 = Instant::now();
        let idle = Duration::from_secs(5);
        let mut s = SliceState::new(t0);
        s.held = units(3, 2, 1);
        s.leased = true;
        assert_eq!(s.expire(t0 + Duration::from_secs(4), idle), None);
        assert!(s.take(&units(1, 0, 0), t0 + Duration::from_secs(4)));
        assert_eq!(s.expire(t0 + Duration::from_secs(8), idle), None);
        assert_eq!(
            s.expire(t0 + Duration::from_secs(9), idle),
            Some(units(2, 2, 1))
        );
        assert_eq!(s.held, [0; 3]);
        assert_eq!(s.expire(t0 + Duration::from_secs(20), idle), None);
    }

    #[test]
    fn the_gauges_show_what_each_slice_holds() {
        let held = SliceHeld::default();
        let slices = Slices::new(0.1, Duration::from_secs(5), held.clone());
        let now = Instant::now();
        let slice = slices.tenant("alice", now);
        {
            let mut s = slice.lock();
            let short = s.claim(&units(10, 5, 1), target(&limits(), 0.1));
            s.leased(&short, &units(1000, 100, 5), now);
        }
        let gauge = |bucket: &str| {
            held.get_or_create(&BucketLabels {
                tenant: "alice".into(),
                bucket: bucket.into(),
            })
            .get()
        };
        assert_eq!((gauge("prefill"), gauge("decode")), (100.0, 10.0));
        assert_eq!(gauge("requests"), 0.5);
        let later = now + Duration::from_secs(5);
        assert_eq!(slices.expire(now, Duration::from_secs(6)), vec![]);
        assert_eq!(
            slices.expire(later, slices.return_after),
            vec![("alice".to_string(), [100 * T, 10 * T, T / 2])]
        );
        assert_eq!(gauge("decode"), 0.0);
        assert!(Arc::ptr_eq(&slices.tenant("alice", later), &slice));
        slices.forget("alice");
        assert!(!Arc::ptr_eq(&slices.tenant("alice", later), &slice));
    }
}
