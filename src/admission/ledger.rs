//! Admission room, pure core: the KV ledger of one backend (bytes of KV cache reserved by live
//! leases and the number of those leases, against the card's capacity and batch size).
//!
//! The capacity admitted against is the *effective* one: the configured capacity times a scale
//! in per mille that backend feedback sets ([`KvLedger::set_capacity_scale`]): below 1,000 while
//! the backend queues or preempts with the ledger showing room (the ledger is optimistic), above
//! it when overcommit is allowed and the backend keeps using much less than the ledger reserves
//! (prefix caching: the ledger is pessimistic). Whether a request could *ever* run still reads
//! the configured capacity, so a passing squeeze makes requests wait, never refuses them as
//! too large.
//!
//! Each priority class may hold at most its share ([`ClassShares`]) of the effective capacity and
//! of the batch, counting only its own leases: what a lower class may not take stays free for
//! the classes above it, so a sheddable flood cannot fill the card and make a critical arrival
//! wait for a sequence to end.

use super::priority::Priority;
use serde::Serialize;

/// What one class's leases hold on one backend, and the most they may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ClassSnapshot {
    /// Its share of the backend, per mille (`admission.standard_share` or `sheddable_share`).
    pub share_permille: u32,
    /// KV bytes its leases hold.
    pub kv_reserved_bytes: u64,
    /// Its live leases.
    pub inflight: u32,
    /// The most KV bytes it may hold: its share of the effective capacity.
    pub kv_limit_bytes: u64,
    /// The most sequences it may run: its share of the batch (at least one).
    pub max_batch: u32,
}

/// Per class, the most of each backend's KV capacity and batch its leases may hold together, in
/// per mille (1,000: all of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassShares([u32; 3]);

impl ClassShares {
    /// Every class may hold everything.
    pub const FULL: ClassShares = ClassShares([KvLedger::UNSCALED; 3]);

    /// `standard` and `sheddable` per mille (clamped to 1..=1,000); `critical` always holds up to
    /// everything.
    pub fn new(standard_permille: u32, sheddable_permille: u32) -> Self {
        let clamp = |p: u32| p.clamp(1, KvLedger::UNSCALED);
        let mut shares = [KvLedger::UNSCALED; 3];
        shares[Priority::Standard as usize] = clamp(standard_permille);
        shares[Priority::Sheddable as usize] = clamp(sheddable_permille);
        ClassShares(shares)
    }

    /// The share of class `p`, per mille.
    pub fn permille(&self, p: Priority) -> u32 {
        self.0[p as usize]
    }

    /// `permille(p)` / 1,000 of `whole`, rounded down.
    fn of(&self, p: Priority, whole: u64) -> u64 {
        let part =
            u128::from(whole) * u128::from(self.permille(p)) / u128::from(KvLedger::UNSCALED);
        u64::try_from(part).unwrap_or(u64::MAX)
    }
}

/// What one lease holds: KV bytes, and the sequences it runs (batch slots: a request asking for
/// `n` choices runs `n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// KV bytes.
    pub bytes: u64,
    /// Sequences, at least one.
    pub sequences: u32,
}

impl From<u64> for Footprint {
    /// `bytes` for one sequence.
    fn from(bytes: u64) -> Self {
        Self {
            bytes,
            sequences: 1,
        }
    }
}

/// What the leases of one class hold on one backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Held {
    bytes: u64,
    live: u32,
}

/// KV-cache bookkeeping of one backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLedger {
    kv_capacity_bytes: u64,
    capacity_scale_permille: u32,
    max_batch: u32,
    shares: ClassShares,
    reserved_bytes: u64,
    live: u32,
    /// Indexed by `Priority as usize`.
    held: [Held; 3],
    /// Its capacity is not known yet (a backend whose geometry is learned from the engine,
    /// before the first reading): nothing fits, and nothing can be told never to fit.
    pending: bool,
}

impl KvLedger {
    /// The scale at which the effective capacity is the configured one.
    pub const UNSCALED: u32 = 1000;

    /// An empty ledger where every class may hold everything.
    pub fn new(kv_capacity_bytes: u64, max_batch: u32) -> Self {
        Self::with_shares(kv_capacity_bytes, max_batch, ClassShares::FULL)
    }

    /// An empty ledger whose classes may hold at most `shares` of it.
    pub fn with_shares(kv_capacity_bytes: u64, max_batch: u32, shares: ClassShares) -> Self {
        Self {
            kv_capacity_bytes,
            capacity_scale_permille: Self::UNSCALED,
            max_batch,
            shares,
            reserved_bytes: 0,
            live: 0,
            held: [Held::default(); 3],
            pending: false,
        }
    }

    /// An empty ledger of a backend whose capacity is not known yet: it admits nothing until
    /// [`Self::resize`] gives it one, and no request is too large for it meanwhile.
    pub fn pending(shares: ClassShares) -> Self {
        Self {
            pending: true,
            ..Self::with_shares(0, 0, shares)
        }
    }

    /// Whether its capacity is still unknown (see [`Self::pending`]).
    pub fn is_pending(&self) -> bool {
        self.pending
    }

    /// KV bytes the backend can hold, as configured (or derived by the capacity model).
    pub fn kv_capacity_bytes(&self) -> u64 {
        self.kv_capacity_bytes
    }

    /// KV bytes admitted against now: the configured capacity scaled by
    /// [`Self::capacity_scale_permille`], rounded down.
    pub fn effective_capacity_bytes(&self) -> u64 {
        let scaled = u128::from(self.kv_capacity_bytes) * u128::from(self.capacity_scale_permille)
            / u128::from(Self::UNSCALED);
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }

    /// The scale of the effective capacity in per mille of the configured one (1,000: as
    /// configured).
    pub fn capacity_scale_permille(&self) -> u32 {
        self.capacity_scale_permille
    }

    /// Sets the effective capacity to `permille` / 1,000 of the configured one. Like a
    /// [`Self::resize`], it moves no lease: live leases keep what they hold and give back
    /// exactly that, and while they hold more than the new effective capacity nothing more
    /// fits. The caller bounds the scale (backend feedback keeps it between a floor and an
    /// overcommit ceiling); the scale survives a resize.
    pub fn set_capacity_scale(&mut self, permille: u32) {
        self.capacity_scale_permille = permille;
    }

    /// Most sequences in flight at once.
    pub fn max_batch(&self) -> u32 {
        self.max_batch
    }

    /// KV bytes held by live leases.
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes
    }

    /// Sequences its live leases run.
    pub fn live(&self) -> u32 {
        self.live
    }

    /// KV bytes of the effective capacity not reserved (none while a shrunk capacity is below
    /// what live leases hold).
    pub fn free_bytes(&self) -> u64 {
        self.effective_capacity_bytes()
            .saturating_sub(self.reserved_bytes)
    }

    /// A reload changed the backend's capacity or batch cap. Live leases keep what they hold
    /// and give back exactly that; while they hold more than the new capacity (or more
    /// sequences than the new cap), nothing more fits until releases bring them under it.
    pub fn resize(&mut self, kv_capacity_bytes: u64, max_batch: u32) {
        self.kv_capacity_bytes = kv_capacity_bytes;
        self.max_batch = max_batch;
        self.pending = false;
    }

    /// The shares of the capacity and batch each class may hold.
    pub fn shares(&self) -> ClassShares {
        self.shares
    }

    /// The most KV bytes class `p` may hold here at the configured capacity (its share of it).
    pub fn class_capacity_bytes(&self, p: Priority) -> u64 {
        self.shares.of(p, self.kv_capacity_bytes)
    }

    /// The most sequences class `p` may run here at once: its share of the batch, rounded down
    /// but at least one (a class with a share is never shut out).
    pub fn class_max_batch(&self, p: Priority) -> u32 {
        let share = self.shares.of(p, u64::from(self.max_batch));
        (u32::try_from(share).unwrap_or(u32::MAX)).clamp(self.max_batch.min(1), self.max_batch)
    }

    /// KV bytes held by class `p`'s leases.
    pub fn class_reserved_bytes(&self, p: Priority) -> u64 {
        self.held[p as usize].bytes
    }

    /// Sequences class `p`'s live leases run.
    pub fn class_live(&self, p: Priority) -> u32 {
        self.held[p as usize].live
    }

    /// What class `p` holds here and may hold.
    pub fn class_snapshot(&self, p: Priority) -> ClassSnapshot {
        ClassSnapshot {
            share_permille: self.shares.permille(p),
            kv_reserved_bytes: self.class_reserved_bytes(p),
            inflight: self.class_live(p),
            kv_limit_bytes: self.shares.of(p, self.effective_capacity_bytes()),
            max_batch: self.class_max_batch(p),
        }
    }

    /// Whether a request of class `p` and footprint `f` could ever run here (alone, on an idle
    /// backend at its configured capacity, within its class's share); a pending ledger cannot
    /// tell yet, so anything could.
    pub fn could_ever_fit(&self, f: impl Into<Footprint>, p: Priority) -> bool {
        let f = f.into();
        self.pending
            || f.sequences <= self.class_max_batch(p) && f.bytes <= self.class_capacity_bytes(p)
    }

    /// Whether a request of class `p` and footprint `f` fits now: reserved + its bytes <=
    /// effective capacity and its sequences have free batch slots, and its class stays within
    /// its share of both.
    pub fn fits(&self, f: impl Into<Footprint>, p: Priority) -> bool {
        let Footprint { bytes, sequences } = f.into();
        let held = self.held[p as usize];
        self.live.saturating_add(sequences) <= self.max_batch
            && bytes <= self.free_bytes()
            && held.live.saturating_add(sequences) <= self.class_max_batch(p)
            && held.bytes.saturating_add(bytes) <= self.class_snapshot(p).kv_limit_bytes
    }

    /// Takes footprint `f`'s bytes and batch slots for class `p`. Returns `false` (and changes
    /// nothing) if they don't fit.
    #[must_use]
    pub fn reserve(&mut self, f: impl Into<Footprint>, p: Priority) -> bool {
        let f = f.into();
        if !self.fits(f, p) {
            return false;
        }
        self.reserved_bytes += f.bytes;
        self.live += f.sequences;
        let held = &mut self.held[p as usize];
        held.bytes += f.bytes;
        held.live += f.sequences;
        true
    }

    /// This backend's capacity, batch cap and shares with `total` (KV bytes, live leases) held,
    /// `by_class` of it (indexed by `Priority as usize`) by each class's leases: the totals a
    /// shared ledger reports (every replica's leases), for the queue to decide on. `total` may
    /// hold more than the classes do (a degraded replica's view counts the other replicas'
    /// part there).
    pub fn with_usage(&self, total: (u64, u32), by_class: [(u64, u32); 3]) -> Self {
        Self {
            reserved_bytes: total.0,
            live: total.1,
            held: by_class.map(|(bytes, live)| Held { bytes, live }),
            ..self.clone()
        }
    }

    /// Gives back what one lease of class `p` and footprint `f` took.
    pub fn release(&mut self, f: impl Into<Footprint>, p: Priority) {
        let Footprint { bytes, sequences } = f.into();
        let held = &mut self.held[p as usize];
        debug_assert!(
            held.live >= sequences && bytes <= held.bytes,
            "release without lease"
        );
        held.bytes = held.bytes.saturating_sub(bytes);
        held.live = held.live.saturating_sub(sequences);
        self.reserved_bytes = self.reserved_bytes.saturating_sub(bytes);
        self.live = self.live.saturating_sub(sequences);
    }
}

/// The backend to admit footprint `f` of class `p` on now: among those where it fits, the one
/// with the most free KV bytes (the lowest index on a tie), so that load spreads and large
/// requests keep a chance.
pub fn choose_backend(ledgers: &[KvLedger], f: impl Into<Footprint>, p: Priority) -> Option<usize> {
    let f = f.into();
    ledgers
        .iter()
        .enumerate()
        .filter(|(_, l)| l.fits(f, p))
        // max_by_key returns the last maximum; reversing keeps the lowest index on ties.
        .rev()
        .max_by_key(|(_, l)| l.free_bytes())
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Priority::{Critical, Sheddable, Standard};

    #[test]
    fn reserve_and_release_keep_exact_numbers() {
        let mut l = KvLedger::new(1000, 2);
        assert!(l.reserve(600, Standard));
        assert_eq!(
            (l.reserved_bytes(), l.live(), l.free_bytes()),
            (600, 1, 400)
        );
        assert!(!l.fits(401, Standard));
        assert!(l.fits(400, Standard));
        assert!(!l.reserve(401, Standard));
        assert_eq!((l.reserved_bytes(), l.live()), (600, 1));
        assert!(l.reserve(400, Standard));
        assert_eq!((l.reserved_bytes(), l.live(), l.free_bytes()), (1000, 2, 0));
        l.release(600, Standard);
        assert_eq!(
            (l.reserved_bytes(), l.live(), l.free_bytes()),
            (400, 1, 600)
        );
        l.release(400, Standard);
        assert_eq!(l, KvLedger::new(1000, 2));
    }

    #[test]
    fn shrunk_below_what_is_reserved_admits_nothing_until_releases_bring_it_under() {
        let mut l = KvLedger::new(1000, 4);
        assert!(l.reserve(600, Standard));
        assert!(l.reserve(300, Standard));
        l.resize(500, 1);
        assert_eq!((l.free_bytes(), l.reserved_bytes(), l.live()), (0, 900, 2));
        assert!(!l.fits(0, Standard));
        assert!(l.could_ever_fit(500, Standard));
        l.release(600, Standard);
        // 300 reserved of 500, but the one live lease fills the new batch cap of 1.
        assert_eq!((l.free_bytes(), l.live()), (200, 1));
        assert!(!l.fits(200, Standard));
        l.release(300, Standard);
        assert_eq!(l, KvLedger::new(500, 1));
        assert!(l.reserve(500, Standard));
    }

    #[test]
    fn a_lease_of_several_sequences_holds_a_batch_slot_for_each() {
        let mut l = KvLedger::with_shares(1000, 4, ClassShares::new(1000, 500));
        let two = |bytes| Footprint {
            bytes,
            sequences: 2,
        };
        assert!(l.reserve(two(200), Standard));
        assert_eq!((l.live(), l.class_live(Standard)), (2, 2));
        // Three more sequences are one past the batch of 4; two fit.
        let three = Footprint {
            bytes: 10,
            sequences: 3,
        };
        assert!(!l.fits(three, Standard));
        assert!(l.could_ever_fit(three, Standard));
        assert!(l.reserve(two(200), Standard));
        assert!(!l.fits(0, Standard), "the batch is full");
        l.release(two(200), Standard);
        assert_eq!((l.live(), l.reserved_bytes()), (2, 200));
        // Sheddable may run half the batch: two sequences, never three.
        assert!(l.fits(two(100), Sheddable));
        assert!(!l.could_ever_fit(three, Sheddable));
        // More sequences than the batch can never run, whatever their bytes.
        let five = Footprint {
            bytes: 1,
            sequences: 5,
        };
        assert!(!l.could_ever_fit(five, Standard));
        assert_eq!(choose_backend(&[l.clone()], five, Standard), None);
        assert_eq!(choose_backend(&[l], two(100), Standard), Some(0));
    }

    #[test]
    fn a_capacity_scale_moves_what_fits_not_what_is_held_nor_what_could_ever_fit() {
        let mut l = KvLedger::new(1000, 4);
        assert!(l.reserve(600, Standard));
        l.set_capacity_scale(500);
        assert_eq!(
            (
                l.effective_capacity_bytes(),
                l.free_bytes(),
                l.reserved_bytes()
            ),
            (500, 0, 600)
        );
        assert!(!l.fits(1, Standard));
        // A squeeze makes requests wait; it never makes them too large to ever run.
        assert!(l.could_ever_fit(1000, Standard));
        assert!(!l.could_ever_fit(1001, Standard));
        l.release(600, Standard);
        assert!(l.fits(500, Standard) && !l.fits(501, Standard));
        // The scale survives a reload's resize and applies to the new capacity.
        l.resize(2000, 4);
        assert_eq!(
            (l.capacity_scale_permille(), l.effective_capacity_bytes()),
            (500, 1000)
        );
        // Overcommit: more than configured fits, rounded down.
        l.set_capacity_scale(1_333);
        assert_eq!(l.effective_capacity_bytes(), 2666);
        assert!(l.reserve(2666, Standard));
        assert!(!l.fits(1, Standard));
        l.release(2666, Standard);
        l.set_capacity_scale(KvLedger::UNSCALED);
        assert_eq!(l, KvLedger::new(2000, 4));
        // No overflow at the top of the range.
        let mut huge = KvLedger::new(u64::MAX, 1);
        huge.set_capacity_scale(2000);
        assert_eq!(huge.effective_capacity_bytes(), u64::MAX);
    }

    #[test]
    fn a_class_holds_at_most_its_share_and_leaves_the_rest_to_the_classes_above() {
        // Standard may hold 60%, sheddable 25% (of 1,000 bytes and a batch of 10).
        let mut l = KvLedger::with_shares(1000, 10, ClassShares::new(600, 250));
        assert_eq!(
            [Sheddable, Standard, Critical]
                .map(|p| (l.class_capacity_bytes(p), l.class_max_batch(p))),
            [(250, 2), (600, 6), (1000, 10)]
        );
        assert!(l.reserve(200, Sheddable));
        assert!(!l.fits(51, Sheddable), "200 + 51 > 250");
        assert!(l.reserve(50, Sheddable));
        assert!(!l.fits(0, Sheddable), "bytes and batch share both spent");
        // The classes above take what sheddable may not: standard up to its own 600.
        assert!(l.reserve(600, Standard));
        assert!(!l.fits(1, Standard));
        assert!(l.reserve(150, Critical));
        assert_eq!((l.reserved_bytes(), l.live(), l.free_bytes()), (1000, 4, 0));
        assert_eq!(
            (l.class_reserved_bytes(Sheddable), l.class_live(Sheddable)),
            (250, 2)
        );
        // A release frees its own class's share, and only that.
        l.release(200, Sheddable);
        assert!(l.fits(200, Sheddable) && !l.fits(201, Sheddable));
        assert!(!l.fits(1, Standard));
        l.release(600, Standard);
        assert!(l.fits(600, Standard) && l.fits(600, Critical));
        // The batch share counts sequences, rounded down: 25% of 10 is 2.
        assert!(l.reserve(0, Sheddable));
        assert!(!l.fits(0, Sheddable));
        // Shares follow the effective capacity: squeezed to half, sheddable may hold 125 bytes.
        l.set_capacity_scale(500);
        assert_eq!(l.class_snapshot(Sheddable).kv_limit_bytes, 125);
        // Whether it could ever run reads its share of the configured capacity.
        assert!(l.could_ever_fit(250, Sheddable) && !l.could_ever_fit(251, Sheddable));
        assert!(l.could_ever_fit(1000, Critical));
    }

    #[test]
    fn a_class_share_of_a_small_batch_still_runs_one_sequence() {
        let l = KvLedger::with_shares(1000, 3, ClassShares::new(1000, 100));
        assert_eq!(l.class_max_batch(Sheddable), 1);
        assert_eq!(
            KvLedger::with_shares(1000, 0, ClassShares::new(1000, 100)).class_max_batch(Sheddable),
            0
        );
        // Shares are clamped to 1..=1,000 per mille.
        assert_eq!(ClassShares::new(0, 5000), ClassShares::new(1, 1000));
    }

    #[test]
    fn with_usage_keeps_the_capacity_and_shares_and_takes_the_totals() {
        let mut l = KvLedger::with_shares(1000, 4, ClassShares::new(1000, 500));
        assert!(l.reserve(100, Standard));
        let shared = l.with_usage((900, 2), [(400, 1), (500, 1), (0, 0)]);
        assert_eq!((shared.kv_capacity_bytes(), shared.max_batch()), (1000, 4));
        assert_eq!(
            (shared.reserved_bytes(), shared.live(), shared.free_bytes()),
            (900, 2, 100)
        );
        assert_eq!(
            (
                shared.class_reserved_bytes(Sheddable),
                shared.class_live(Standard)
            ),
            (400, 1)
        );
        assert!(shared.fits(100, Standard) && !shared.fits(101, Standard));
        // Sheddable holds 400 of its 500: 100 more would fit the card, not its share.
        assert!(!shared.fits(101, Sheddable) && shared.fits(100, Sheddable));
        assert!(!l.with_usage((0, 4), [(0, 0); 3]).fits(0, Critical));
    }

    #[test]
    fn batch_limit_binds_even_with_free_bytes() {
        let mut l = KvLedger::new(1000, 2);
        assert!(l.reserve(0, Standard));
        assert!(l.reserve(10, Standard));
        assert!(!l.fits(0, Standard));
        assert_eq!(l.free_bytes(), 990);
    }

    #[test]
    fn could_ever_fit_needs_capacity_and_a_batch() {
        assert!(KvLedger::new(1000, 1).could_ever_fit(1000, Standard));
        assert!(!KvLedger::new(1000, 1).could_ever_fit(1001, Standard));
        assert!(!KvLedger::new(1000, 0).could_ever_fit(1, Standard));
    }

    #[test]
    fn chooses_the_backend_with_most_free_bytes_where_it_fits() {
        let mut a = KvLedger::new(1000, 4);
        let b = KvLedger::new(800, 4);
        let mut c = KvLedger::new(2000, 1);
        assert!(a.reserve(100, Standard));
        assert!(c.reserve(1, Standard));
        // free: a 900, b 800, c full by batch.
        assert_eq!(
            choose_backend(&[a.clone(), b.clone(), c.clone()], 500, Standard),
            Some(0)
        );
        assert_eq!(
            choose_backend(&[a.clone(), b.clone(), c], 850, Standard),
            Some(0)
        );
        assert_eq!(
            choose_backend(&[b.clone(), a.clone()], 500, Standard),
            Some(1)
        );
        assert_eq!(choose_backend(&[a.clone(), b], 901, Standard), None);
        assert_eq!(choose_backend(&[a.clone(), a], 10, Standard), Some(0));
    }
}
