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

/// KV-cache bookkeeping of one backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLedger {
    kv_capacity_bytes: u64,
    capacity_scale_permille: u32,
    max_batch: u32,
    reserved_bytes: u64,
    live: u32,
}

impl KvLedger {
    /// The scale at which the effective capacity is the configured one.
    pub const UNSCALED: u32 = 1000;

    /// An empty ledger.
    pub fn new(kv_capacity_bytes: u64, max_batch: u32) -> Self {
        Self {
            kv_capacity_bytes,
            capacity_scale_permille: Self::UNSCALED,
            max_batch,
            reserved_bytes: 0,
            live: 0,
        }
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

    /// Live leases.
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
    }

    /// Whether a request of `bytes` could ever run here (alone, on an idle backend at its
    /// configured capacity).
    pub fn could_ever_fit(&self, bytes: u64) -> bool {
        self.max_batch > 0 && bytes <= self.kv_capacity_bytes
    }

    /// Whether a request of `bytes` fits now: reserved + bytes <= effective capacity and a batch
    /// slot is free.
    pub fn fits(&self, bytes: u64) -> bool {
        self.live < self.max_batch && bytes <= self.free_bytes()
    }

    /// Takes `bytes` and a batch slot. Returns `false` (and changes nothing) if they don't fit.
    #[must_use]
    pub fn reserve(&mut self, bytes: u64) -> bool {
        if !self.fits(bytes) {
            return false;
        }
        self.reserved_bytes += bytes;
        self.live += 1;
        true
    }

    /// Gives back what one lease of `bytes` took.
    pub fn release(&mut self, bytes: u64) {
        debug_assert!(
            self.live > 0 && bytes <= self.reserved_bytes,
            "release without lease"
        );
        self.reserved_bytes = self.reserved_bytes.saturating_sub(bytes);
        self.live = self.live.saturating_sub(1);
    }
}

/// The backend to admit `bytes` on now: among those where it fits, the one with the most free KV
/// bytes (the lowest index on a tie), so that load spreads and large requests keep a chance.
pub fn choose_backend(ledgers: &[KvLedger], bytes: u64) -> Option<usize> {
    ledgers
        .iter()
        .enumerate()
        .filter(|(_, l)| l.fits(bytes))
        // max_by_key returns the last maximum; reversing keeps the lowest index on ties.
        .rev()
        .max_by_key(|(_, l)| l.free_bytes())
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_and_release_keep_exact_numbers() {
        let mut l = KvLedger::new(1000, 2);
        assert!(l.reserve(600));
        assert_eq!(
            (l.reserved_bytes(), l.live(), l.free_bytes()),
            (600, 1, 400)
        );
        assert!(!l.fits(401));
        assert!(l.fits(400));
        assert!(!l.reserve(401));
        assert_eq!((l.reserved_bytes(), l.live()), (600, 1));
        assert!(l.reserve(400));
        assert_eq!((l.reserved_bytes(), l.live(), l.free_bytes()), (1000, 2, 0));
        l.release(600);
        assert_eq!(
            (l.reserved_bytes(), l.live(), l.free_bytes()),
            (400, 1, 600)
        );
        l.release(400);
        assert_eq!(l, KvLedger::new(1000, 2));
    }

    #[test]
    fn shrunk_below_what_is_reserved_admits_nothing_until_releases_bring_it_under() {
        let mut l = KvLedger::new(1000, 4);
        assert!(l.reserve(600));
        assert!(l.reserve(300));
        l.resize(500, 1);
        assert_eq!((l.free_bytes(), l.reserved_bytes(), l.live()), (0, 900, 2));
        assert!(!l.fits(0));
        assert!(l.could_ever_fit(500));
        l.release(600);
        // 300 reserved of 500, but the one live lease fills the new batch cap of 1.
        assert_eq!((l.free_bytes(), l.live()), (200, 1));
        assert!(!l.fits(200));
        l.release(300);
        assert_eq!(l, KvLedger::new(500, 1));
        assert!(l.reserve(500));
    }

    #[test]
    fn a_capacity_scale_moves_what_fits_not_what_is_held_nor_what_could_ever_fit() {
        let mut l = KvLedger::new(1000, 4);
        assert!(l.reserve(600));
        l.set_capacity_scale(500);
        assert_eq!(
            (
                l.effective_capacity_bytes(),
                l.free_bytes(),
                l.reserved_bytes()
            ),
            (500, 0, 600)
        );
        assert!(!l.fits(1));
        // A squeeze makes requests wait; it never makes them too large to ever run.
        assert!(l.could_ever_fit(1000));
        assert!(!l.could_ever_fit(1001));
        l.release(600);
        assert!(l.fits(500) && !l.fits(501));
        // The scale survives a reload's resize and applies to the new capacity.
        l.resize(2000, 4);
        assert_eq!(
            (l.capacity_scale_permille(), l.effective_capacity_bytes()),
            (500, 1000)
        );
        // Overcommit: more than configured fits, rounded down.
        l.set_capacity_scale(1_333);
        assert_eq!(l.effective_capacity_bytes(), 2666);
        assert!(l.reserve(2666));
        assert!(!l.fits(1));
        l.release(2666);
        l.set_capacity_scale(KvLedger::UNSCALED);
        assert_eq!(l, KvLedger::new(2000, 4));
        // No overflow at the top of the range.
        let mut huge = KvLedger::new(u64::MAX, 1);
        huge.set_capacity_scale(2000);
        assert_eq!(huge.effective_capacity_bytes(), u64::MAX);
    }

    #[test]
    fn batch_limit_binds_even_with_free_bytes() {
        let mut l = KvLedger::new(1000, 2);
        assert!(l.reserve(0));
        assert!(l.reserve(10));
        assert!(!l.fits(0));
        assert_eq!(l.free_bytes(), 990);
    }

    #[test]
    fn could_ever_fit_needs_capacity_and_a_batch() {
        assert!(KvLedger::new(1000, 1).could_ever_fit(1000));
        assert!(!KvLedger::new(1000, 1).could_ever_fit(1001));
        assert!(!KvLedger::new(1000, 0).could_ever_fit(1));
    }

    #[test]
    fn chooses_the_backend_with_most_free_bytes_where_it_fits() {
        let mut a = KvLedger::new(1000, 4);
        let b = KvLedger::new(800, 4);
        let mut c = KvLedger::new(2000, 1);
        assert!(a.reserve(100));
        assert!(c.reserve(1));
        // free: a 900, b 800, c full by batch.
        assert_eq!(
            choose_backend(&[a.clone(), b.clone(), c.clone()], 500),
            Some(0)
        );
        assert_eq!(choose_backend(&[a.clone(), b.clone(), c], 850), Some(0));
        assert_eq!(choose_backend(&[b.clone(), a.clone()], 500), Some(1));
        assert_eq!(choose_backend(&[a.clone(), b], 901), None);
        assert_eq!(choose_backend(&[a.clone(), a], 10), Some(0));
    }
}
