//! Quota room, the local store's file: each meter's slices (spend and grants) in a `redb`
//! database, written whole in one transaction that is on disk when the commit returns. A crash
//! at any moment leaves the file as of the last commit, so a `kill -9` loses at most the spend
//! settled since the last flush (`quotas.flush_interval`).

use super::ledger::Slice;
use anyhow::Context;
use redb::{Database, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};

/// `tenant \0 meter id` -> the meter's slices as JSON.
const SPEND: TableDefinition<&str, &[u8]> = TableDefinition::new("spend");

/// The file a [`super::store::LocalQuotaStore`] keeps its spend in.
pub struct QuotaFile {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for QuotaFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaFile")
            .field("path", &self.path)
            .finish()
    }
}

impl QuotaFile {
    /// Opens the file at `path`, made when missing (another process holding it open is an
    /// error: two gateways cannot share one file).
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let db = Database::create(path).with_context(|| {
            format!(
                "opening the quota file {} (quotas.path; one gateway per file)",
                path.display()
            )
        })?;
        Ok(Self {
            db,
            path: path.to_path_buf(),
        })
    }

    /// Every meter's slices the file holds: `(tenant, meter id, slices)`.
    pub fn load(&self) -> anyhow::Result<Vec<(String, String, Vec<Slice>)>> {
        let read = self.db.begin_read()?;
        let table = match read.open_table(SPEND) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (key, value) = entry?;
            let Some((tenant, meter)) = key.value().split_once('\0') else {
                continue;
            };
            let slices: Vec<Slice> = serde_json::from_slice(value.value())
                .with_context(|| format!("quota file {}: meter {meter}", self.path.display()))?;
            out.push((tenant.to_string(), meter.to_string(), slices));
        }
        Ok(out)
    }

    /// Replaces what the file holds with `spend`, in one durable transaction.
    pub fn save(&mut self, spend: &[(String, String, Vec<Slice>)]) -> anyhow::Result<()> {
        let write = self.db.begin_write()?;
        {
            let mut table = write.open_table(SPEND)?;
            table.retain(|_, _| false)?;
            for (tenant, meter, slices) in spend {
                let key = format!("{tenant}\0{meter}");
                table.insert(key.as_str(), serde_json::to_vec(slices)?.as_slice())?;
            }
        }
        write
            .commit()
            .with_context(|| format!("writing the quota file {}", self.path.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_saved_is_loaded_by_the_next_open_and_a_save_replaces_it() {
        let dir = std::env::temp_dir().join(format!("tokengate-quota-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("quotas.redb");
        let _ = std::fs::remove_file(&path);
        let slice = |start, spent| Slice {
            start,
            spent,
            granted: 0,
        };
        {
            let mut file = QuotaFile::open(&path).unwrap();
            assert_eq!(file.load().unwrap(), vec![]);
            file.save(&[
                ("a".into(), "calendar-day|decode".into(), vec![slice(10, 5)]),
                (
                    "b".into(),
                    "1h|total".into(),
                    vec![slice(1, 2), slice(2, 3)],
                ),
            ])
            .unwrap();
        }
        let mut file = QuotaFile::open(&path).unwrap();
        assert_eq!(
            file.load().unwrap(),
            vec![
                ("a".into(), "calendar-day|decode".into(), vec![slice(10, 5)]),
                (
                    "b".into(),
                    "1h|total".into(),
                    vec![slice(1, 2), slice(2, 3)]
                ),
            ]
        );
        file.save(&[("a".into(), "calendar-day|decode".into(), vec![slice(10, 7)])])
            .unwrap();
        assert_eq!(
            file.load().unwrap(),
            vec![("a".into(), "calendar-day|decode".into(), vec![slice(10, 7)])]
        );
        drop(file);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
