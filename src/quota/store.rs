//! Quota room, storage: where the meters' states live. [`LocalQuotaStore`] keeps them in this
//! process (and writes their spend to a file, [`super::persist`]); the Redis store
//! ([`super::redis`]) shares them between replicas. Both decide with the pure core in
//! [`super::ledger`].

use super::config::OnWriteError;
use super::ledger::{self, Meter, QuotaDenial, Reading, TenantState};
use super::persist::{Disk, FileSystem, QuotaFile, Spend};
use dashmap::DashMap;
use futures_util::future::{self, BoxFuture};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
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

/// How the local store's file writes go: `tokengate_quota_file_writable` (0 while the last
/// write failed, else 1) and `tokengate_quota_file_write_errors_total`.
#[derive(Clone, Debug, Default)]
pub struct FileMetrics {
    /// 0 while the last write of the file failed, else 1.
    pub writable: Gauge,
    /// Writes of the file that failed.
    pub write_errors: Counter,
}

impl FileMetrics {
    /// Registers both, writable until a write fails.
    pub fn register(&self, r: &mut Registry) {
        self.writable.set(1);
        r.register(
            "quota_file_writable",
            "0 while the last write of the local quota store's file (quotas.path) failed, else 1: spend since the last write is lost if the process stops meanwhile",
            self.writable.clone(),
        );
        r.register(
            "quota_file_write_errors",
            "Writes of the local quota store's file that failed (each tried again at the next flush, the file reopened)",
            self.write_errors.clone(),
        );
    }
}

/// What the local store does while it cannot write its file, and where it says so.
#[derive(Clone, Debug, Default)]
pub struct WriteErrors {
    /// `quotas.on_write_error`.
    pub policy: OnWriteError,
    /// Where it says so.
    pub metrics: FileMetrics,
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
    /// What it does while the file cannot be written.
    write_errors: WriteErrors,
    /// The last write of the file failed.
    unwritten: AtomicBool,
}

/// The local store's file: its path, the disk it is on, and once it exists, the open database.
#[derive(Debug)]
struct Kept {
    path: PathBuf,
    disk: Box<dyn Disk>,
    open: Option<QuotaFile>,
}

impl LocalQuotaStore {
    /// A store in memory only: a restart forgets every spend.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A store whose spend is kept in the file at `path`, starting from what it holds (what
    /// can still be read of it, when it is damaged: [`QuotaFile::recover`]). The file is made
    /// by the first flush with spend to write (a gateway whose tenants spend nothing writes
    /// none).
    /// While the file cannot be written it does what `write_errors` says.
    pub fn persisted(path: &Path, write_errors: WriteErrors) -> anyhow::Result<Self> {
        Self::persisted_on(path, Box::new(FileSystem), write_errors)
    }

    /// [`LocalQuotaStore::persisted`] on `disk`.
    pub fn persisted_on(
        path: &Path,
        disk: Box<dyn Disk>,
        write_errors: WriteErrors,
    ) -> anyhow::Result<Self> {
        let tenants: DashMap<String, TenantState> = DashMap::new();
        let (open, spend) = match path.exists() {
            true => {
                let (file, spend) = QuotaFile::recover(path, disk.as_ref())?;
                (Some(file), spend)
            }
            false => (None, Vec::new()),
        };
        for (tenant, meter, slices) in spend {
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
                disk,
                open,
            })),
            write_errors,
            unwritten: AtomicBool::new(false),
        })
    }

    fn with<R>(&self, tenant: &str, f: impl FnOnce(&mut TenantState) -> R) -> R {
        match self.tenants.get_mut(tenant) {
            Some(mut state) => f(&mut state),
            None => f(&mut self.tenants.entry(tenant.to_string()).or_default()),
        }
    }

    /// Every meter's slices, for the file.
    fn spend(&self) -> Spend {
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
            None => QuotaFile::open_on(&kept.path, kept.disk.as_ref()).and_then(|mut file| {
                file.save(&spend)?;
                kept.open = Some(file);
                Ok(())
            }),
        };
        let metrics = &self.write_errors.metrics;
        if written.is_err() {
            // A database a write failed in refuses every transaction after it: the next flush
            // opens the file again, which holds what the last commit wrote, and writes it all.
            kept.open = None;
            self.dirty.store(true, Ordering::Release);
            metrics.write_errors.inc();
        }
        self.unwritten.store(written.is_err(), Ordering::Release);
        metrics.writable.set(i64::from(written.is_ok()));
        written
    }

    /// Whether requests are refused now: the file cannot be written and the policy says so.
    fn refusing(&self) -> bool {
        self.write_errors.policy == OnWriteError::Refuse && self.unwritten.load(Ordering::Acquire)
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
        if self.refusing() {
            let why = "its file cannot be written: quotas.on_write_error = \"refuse\" refuses requests until a write goes through";
            return Box::pin(future::ready(Err(QuotaRefusal::Unavailable(why.into()))));
        }
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
