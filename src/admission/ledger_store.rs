//! The shared KV ledger's store: the Redis script every replica admits through, what one
//! replica holds of the ledger (its leases), and the handle the admission keeps on it. What is
//! done with them (arrivals, grants, the heartbeat) is [`super::shared`]'s.

use super::ledger::KvLedger;
use super::priority::Priority;
use super::queue::Grant;
use crate::limiter::config::{LimiterConfig, OnStoreError};
use crate::limiter::redis::{connect, timed, StoreError, StoreMetrics};
use redis::aio::ConnectionManager;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// The ledger script (see its header for the keys, arguments and replies).
pub(super) const SCRIPT: &str = include_str!("ledger.lua");

/// Every class by `Priority as usize`, the script's class numbers.
pub(super) const CLASSES: [Priority; 3] =
    [Priority::Sheddable, Priority::Standard, Priority::Critical];

/// The shared KV ledger in Redis, as one replica uses it.
pub struct LedgerStore {
    pub(super) conn: ConnectionManager,
    pub(super) script: redis::Script,
    /// The registry, the reserved and live totals, this replica's leases.
    pub(super) keys: [String; 4],
    /// Every replica's lease hash is this followed by the replica's name.
    pub(super) lease_prefix: String,
    pub(super) replica: String,
    pub(super) ttl: Duration,
    pub(super) timeout: Duration,
    pub(super) recheck: Duration,
    pub(super) retry: Duration,
    pub(super) policy: OnStoreError,
    pub(super) replicas: u32,
    pub(super) metrics: StoreMetrics,
}

impl std::fmt::Debug for LedgerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerStore")
            .field("replica", &self.replica)
            .field("registry", &self.keys[0])
            .finish_non_exhaustive()
    }
}

impl LedgerStore {
    /// The ledger for `config` (validated, `store = "redis"`) of one set of backends: its keys
    /// are `PREFIX{kv-ledger}:NAMESPACE...` (one hash tag, so one script may touch every
    /// backend's totals on a Redis Cluster; `namespace` is empty for the generation backends,
    /// `pooling:` for the pooling ones). Connects lazily.
    pub fn new(
        config: &LimiterConfig,
        namespace: &str,
        metrics: StoreMetrics,
    ) -> anyhow::Result<Self> {
        let base = format!("{}{{kv-ledger}}:{namespace}", config.key_prefix);
        let replica = format!("{:016x}", rand::random::<u64>());
        let lease_prefix = format!("{base}leases:");
        Ok(Self {
            conn: connect(config)?,
            script: redis::Script::new(SCRIPT),
            keys: [
                format!("{base}replicas"),
                format!("{base}reserved"),
                format!("{base}live"),
                format!("{lease_prefix}{replica}"),
            ],
            lease_prefix,
            replica,
            ttl: config.kv_lease_ttl,
            timeout: config.connect_timeout + config.command_timeout,
            recheck: config.kv_recheck_interval,
            retry: config.retry_interval,
            policy: config.on_store_error,
            replicas: config.expected_replicas.unwrap_or(1),
            metrics,
        })
    }

    /// Runs `op` with `items` (`m` of them, already flattened) over `backends`.
    pub(super) async fn call(
        &self,
        op: &str,
        backends: &[Backend],
        m: usize,
        items: &[String],
    ) -> Result<Reply, StoreError> {
        let mut call = self.script.prepare_invoke();
        for key in &self.keys {
            call.key(key);
        }
        call.arg(op)
            .arg(&self.replica)
            .arg(self.ttl.as_millis().to_string())
            .arg(&self.lease_prefix)
            .arg(backends.len());
        for b in backends {
            call.arg(&b.name).arg(b.capacity).arg(b.max_batch);
            for (bytes, batch) in b.limits {
                call.arg(bytes).arg(batch);
            }
        }
        call.arg(m).arg(items);
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = timed(
            &self.metrics,
            self.timeout,
            &format!("kv_{op}"),
            call.invoke_async(&mut conn),
        )
        .await?;
        if reply.len() != m + 6 * backends.len() {
            return Err(StoreError::Reply(format!("{reply:?}")));
        }
        let usage = reply[m..]
            .chunks(6)
            .map(|b| {
                std::array::from_fn(|c| {
                    (
                        u64::try_from(b[2 * c]).unwrap_or(0),
                        u32::try_from(b[2 * c + 1]).unwrap_or(0),
                    )
                })
            })
            .collect();
        Ok(Reply {
            results: reply[..m].to_vec(),
            usage,
        })
    }

    /// The usage a degraded replica admits against: its own leases, plus what `local` leaves
    /// to the other replicas, so that a backend is full here when this replica holds its
    /// share.
    pub(super) fn fallback_view(&self, ledger: &KvLedger, own: ClassUsage) -> KvLedger {
        let (bytes, batch) = match self.policy {
            OnStoreError::Local => {
                let n = u64::from(self.replicas);
                let capacity = ledger.effective_capacity_bytes();
                let batch = ledger.max_batch();
                // At least one sequence each, or a replica could admit nothing at all.
                let share = if batch == 0 {
                    0
                } else {
                    (batch / self.replicas).max(1)
                };
                (capacity - capacity / n, batch - share)
            }
            OnStoreError::FailOpen | OnStoreError::FailClosed => (0, 0),
        };
        let mine = total(&own);
        ledger.with_usage((mine.0 + bytes, mine.1 + batch), own)
    }
}

/// One backend as the script sees it.
pub(super) struct Backend {
    pub(super) name: String,
    pub(super) capacity: u64,
    pub(super) max_batch: u32,
    /// Per class (by `Priority as usize`), the most KV bytes and sequences its leases may hold.
    pub(super) limits: [(u64, u32); 3],
}

/// What the script answered: one result per item, and every backend's totals.
pub(super) struct Reply {
    pub(super) results: Vec<i64>,
    pub(super) usage: Vec<ClassUsage>,
}

/// KV bytes reserved and leases live.
pub(super) type Usage = (u64, u32);

/// What each class holds (indexed by `Priority as usize`).
pub(super) type ClassUsage = [Usage; 3];

/// What the classes hold together.
pub(super) fn total(by_class: &ClassUsage) -> Usage {
    (by_class.iter()).fold((0, 0), |(bytes, live), u| (bytes + u.0, live + u.1))
}

/// One lease of this replica.
#[derive(Clone, Copy, Debug)]
pub(super) struct Live {
    /// Its backend, once Redis placed it.
    pub(super) backend: Option<usize>,
    pub(super) bytes: u64,
    /// The sequences (batch slots) it runs.
    pub(super) sequences: u32,
    pub(super) class: Priority,
}

/// This replica's part of the shared ledger (kept in the admission state, under its lock).
#[derive(Debug)]
pub(super) struct ReplicaState {
    /// Live leases by id.
    pub(super) live: HashMap<u64, Live>,
    /// What this replica's leases hold per backend and class.
    pub(super) own: Vec<ClassUsage>,
    pub(super) next_id: u64,
    /// Redis cannot be reached: `on_store_error` decides.
    pub(super) degraded: bool,
    /// Releases waiting for Redis to answer (the background task's count).
    pub(super) unsent: usize,
}

impl ReplicaState {
    pub(super) fn new(backends: usize) -> Self {
        Self {
            live: HashMap::new(),
            own: vec![[(0, 0); 3]; backends],
            next_id: 0,
            degraded: false,
            unsent: 0,
        }
    }

    /// A new lease id for `grant`, live from now on (on its backend at once when `placed`, else
    /// once Redis places it).
    pub(super) fn register(&mut self, grant: &Grant, placed: bool) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let lease = Live {
            backend: None,
            bytes: grant.need.bytes,
            sequences: grant.need.sequences,
            class: grant.class,
        };
        self.live.insert(id, lease);
        if placed {
            self.placed(id, grant.backend);
        }
        id
    }

    /// Lease `id` (live) is placed on `backend`.
    pub(super) fn placed(&mut self, id: u64, backend: usize) {
        let lease = self.live.get_mut(&id).expect("a registered lease");
        lease.backend = Some(backend);
        let own = &mut self.own[backend][lease.class as usize];
        own.0 += lease.bytes;
        own.1 += lease.sequences;
    }
}

/// The admission's handle on the shared ledger.
pub(super) struct Link {
    pub(super) store: Arc<LedgerStore>,
    /// Leases to give back in Redis (by the background task, in order).
    pub(super) releases: mpsc::UnboundedSender<u64>,
    pub(super) wake: Arc<Notify>,
}

impl Link {
    /// Asks the background task for a pass now (a release to send, waiters to grant).
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }
}

/// This replica's view of the shared ledger, for snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SharedSnapshot {
    /// `redis` (the backends' numbers are every replica's, as last read from Redis) or
    /// `fallback` (Redis cannot be reached: this replica's leases, `on_store_error` decides).
    pub state: &'static str,
    /// This replica's name in the ledger.
    pub replica: String,
    /// This replica's leases per backend, in configuration order.
    pub here: Vec<HereSnapshot>,
    /// Leases given back here whose release waits for Redis to answer.
    pub releases_unsent: usize,
}

/// One backend's leases held by this replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HereSnapshot {
    /// KV bytes its leases hold.
    pub kv_reserved_bytes: u64,
    /// Its live leases.
    pub inflight: u32,
}
