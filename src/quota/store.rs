//! Quota room, storage: where the meters' states live. [`LocalQuotaStore`] keeps them in this
//! process (and writes their spend to a file, [`super::persist`]); the Redis store
//! ([`super::redis`]) shares them between replicas. Both decide with the pure core in
//! [`super::ledger`].

use super::ledger::{self, Meter, QuotaDenial, Reading, Slice, TenantState};
use super::persist::QuotaFile;
use dashmap::DashMap;
use futures_util::future::{self, BoxFuture};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Why a reservation was not made.
#[derive(Clone, Debug, PartialEq)]
pub enum QuotaRefusal {
    /// A meter has not room for the request.
    Denied(Box<QuotaDenial>),
    /// The store could not be asked (Redis down): nothing was reserved.
    Unavailable(String),
}

/// The store could not be asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the quota store cannot be reached: {0}")]
pub struct StoreDown(pub String);

/// Storage of tenants' meters. Meters (and their limits) are passed on every call, so a reload
/// that changes a limit applies at once and the spend stays.
pub trait QuotaStore: Send + Sync + 'static {
    /// Reserves `amounts[i]` on `meters[i]`, all or nothing, as `lease`.
    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        meters: &'a [Meter],
        amounts: &'a [u64],
        now: i64,
        lease: u64,
    ) -> BoxFuture<'a, Result<Vec<Reading>, QuotaRefusal>>;

    /// Swaps `lease`'s reservation `reserved` for what was used, `used`. Synchronous so that a
    /// `Drop` can call it (a remote store spawns the write).
    fn settle(
        &self,
        tenant: &str,
        meters: &[Meter],
        reserved: &[u64],
        used: &[u64],
        now: i64,
        lease: u64,
    );

    /// The meters as they are at `now`.
    fn read<'a>(
        &'a self,
        tenant: &'a str,
        meters: &'a [Meter],
        now: i64,
    ) -> BoxFuture<'a, Result<Vec<Reading>, StoreDown>>;

    /// Raises `meter`'s limit by `amount` for the rest of its window (see [`ledger::grant`]).
    fn grant<'a>(
        &'a self,
        tenant: &'a str,
        meter: &'a Meter,
        amount: u64,
        now: i64,
    ) -> BoxFuture<'a, Result<Reading, StoreDown>>;

    /// Forgets what `meter`'s window has spent and been granted (see [`ledger::reset`]).
    fn reset<'a>(
        &'a self,
        tenant: &'a str,
        meter: &'a Meter,
        now: i64,
    ) -> BoxFuture<'a, Result<Reading, StoreDown>>;

    /// Writes what is not yet kept to where it survives the process (nothing for a store that
    /// is there already). It may wait on a disk: [`super::Quotas::flush`] runs it off the
    /// async executor.
    fn flush(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// The meters of one gateway, in memory, each tenant behind its own lock (all its meters
/// change together); with a [`QuotaFile`], their spend is written to it by
/// [`QuotaStore::flush`] and read back at start.
#[derive(Debug, Default)]
pub struct LocalQuotaStore {
    tenants: DashMap<String, TenantState>,
    /// Spend changed since the last flush.
    dirty: AtomicBool,
    /// Where spend is written, one flush at a time (`None`: in memory only).
    file: Option<Mutex<Kept>>,
}

/// The local store's file: its path, and once it exists, the open database.
#[derive(Debug)]
struct Kept {
    path: PathBuf,
    open: Option<QuotaFile>,
}

impl LocalQuotaStore {
    /// A store in memory only: a restart forgets every spend.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A store whose spend is kept in the file at `path`, starting from what it holds. The
    /// file is made by the first flush with spend to write (a gateway whose tenants spend
    /// nothing writes none).
    pub fn persisted(path: &Path) -> anyhow::Result<Self> {
        let tenants: DashMap<String, TenantState> = DashMap::new();
        let open = match path.exists() {
            true => Some(QuotaFile::open(path)?),
            false => None,
        };
        let spend = open.as_ref().map(QuotaFile::load).transpose()?;
        for (tenant, meter, slices) in spend.unwrap_or_default() {
            tenants.entry(tenant).or_default().insert(
                meter,
                ledger::MeterState {
                    slices,
                    reserved: 0,
                },
            );
        }
        Ok(Self {
            tenants,
            dirty: AtomicBool::new(false),
            file: Some(Mutex::new(Kept {
                path: path.to_path_buf(),
                open,
            })),
        })
    }

    fn with<R>(&self, tenant: &str, f: impl FnOnce(&mut TenantState) -> R) -> R {
        match self.tenants.get_mut(tenant) {
            Some(mut state) => f(&mut state),
            None => f(&mut self.tenants.entry(tenant.to_string()).or_default()),
        }
    }

    /// Every meter's slices, for the file.
    fn spend(&self) -> Vec<(String, String, Vec<Slice>)> {
        let mut out = Vec::new();
        for entry in &self.tenants {
            for (meter, state) in entry.value() {
                if !state.slices.is_empty() {
                    out.push((entry.key().clone(), meter.clone(), state.slices.clone()));
                }
            }
        }
        out
    }

    /// [`QuotaStore::flush`]: the spend, when it changed, written to the file and on disk.
    fn flush_to_file(&self) -> anyhow::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let mut kept = file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let spend = self.spend();
        let written = match &mut kept.open {
            Some(file) => file.save(&spend),
            None => QuotaFile::open(&kept.path).and_then(|mut file| {
                file.save(&spend)?;
                kept.open = Some(file);
                Ok(())
            }),
        };
        written.inspect_err(|_| self.dirty.store(true, Ordering::Release))
    }

    fn changed(&self) {
        self.dirty.store(true, Ordering::Release);
    }
}

impl QuotaStore for LocalQuotaStore {
    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        meters: &'a [Meter],
        amounts: &'a [u64],
        now: i64,
        _lease: u64,
    ) -> BoxFuture<'a, Result<Vec<Reading>, QuotaRefusal>> {
        let result = self.with(tenant, |state| ledger::reserve(state, meters, amounts, now));
        Box::pin(future::ready(result.map_err(QuotaRefusal::Denied)))
    }

    fn settle(
        &self,
        tenant: &str,
        meters: &[Meter],
        reserved: &[u64],
        used: &[u64],
        now: i64,
        _lease: u64,
    ) {
        self.with(tenant, |state| {
            ledger::settle(state, meters, reserved, used, now)
        });
        if used.iter().any(|&u| u > 0) {
            self.changed();
        }
    }

    fn read<'a>(
        &'a self,
        tenant: &'a str,
        meters: &'a [Meter],
        now: i64,
    ) -> BoxFuture<'a, Result<Vec<Reading>, StoreDown>> {
        let readings = self.with(tenant, |state| ledger::read(state, meters, now));
        Box::pin(future::ready(Ok(readings)))
    }

    fn grant<'a>(
        &'a self,
        tenant: &'a str,
        meter: &'a Meter,
        amount: u64,
        now: i64,
    ) -> BoxFuture<'a, Result<Reading, StoreDown>> {
        let reading = self.with(tenant, |state| ledger::grant(state, meter, amount, now));
        self.changed();
        Box::pin(future::ready(Ok(reading)))
    }

    fn reset<'a>(
        &'a self,
        tenant: &'a str,
        meter: &'a Meter,
        now: i64,
    ) -> BoxFuture<'a, Result<Reading, StoreDown>> {
        let reading = self.with(tenant, |state| ledger::reset(state, meter, now));
        self.changed();
        Box::pin(future::ready(Ok(reading)))
    }

    fn flush(&self) -> anyhow::Result<()> {
        self.flush_to_file()
    }
}
