//! Where a drill's writes go: the reference store over HTTP, or a PostgreSQL database through
//! the adapter (a table of the drill's own for strict mode, Palisade's tables for activated).

use std::sync::Arc;

use palisade_client::encode_path_segment;
use palisade_core::{LockName, TokenVerifier};
use palisade_fence::{Activation, FenceMode, FencedResource, Outcome, Rejection, Verifier};
use palisade_fence_postgres::{GuardedTable, PostgresFence, RowLock};

/// A resource as the worker sees it. Outcomes are short codes: `accepted`, `replay`, or the
/// resource's rejection code (`stale_epoch`, `invalid_token`, …), or `error: …`.
pub enum Target {
    /// The reference store at this base URL.
    Http { base: String, http: reqwest::Client },
    /// PostgreSQL: strict mode writes row `key` of `table`; activated mode uses Palisade's tables.
    Postgres {
        fence: PostgresFence,
        table: Box<GuardedTable>,
        table_name: String,
    },
}

/// The coordinator's keys, and its lock floors verified with them (a PostgreSQL target learns
/// a lock's floor after its database restarted or was restored).
pub async fn coordinator_keys(
    coordinator: &str,
) -> anyhow::Result<(Arc<Verifier>, Arc<palisade_resource::KeyRing>)> {
    use palisade_resource::{KeyRing, KeySource};
    let verifier = Arc::new(Verifier::new(TokenVerifier::new([])));
    let keys = KeyRing::new(
        KeySource::Coordinator(coordinator.to_owned()),
        Vec::new(),
        verifier.clone(),
        None,
    )?;
    keys.load_initial().await?;
    anyhow::ensure!(keys.ready(), "no keys at the coordinator {coordinator}");
    Ok((verifier, Arc::new(keys)))
}

/// The drill's own table in a user's database.
pub fn drill_table_name(run: &str) -> String {
    format!("palisade_drill_{run}")
}

impl Target {
    /// Connects to `url` (`http://…` or `postgres://…`).
    pub async fn connect(
        url: &str,
        mode: FenceMode,
        coordinator: &str,
        run: &str,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::new();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let (verifier, floors) = coordinator_keys(coordinator).await?;
            let fence = PostgresFence::connect(url, 2, mode, verifier)
                .await?
                .with_floors(floors);
            let table_name = drill_table_name(run);
            let table =
                GuardedTable::new(&table_name, "id", "payload", RowLock::Column("lock".into()))?;
            Ok(Target::Postgres {
                fence,
                table: Box::new(table),
                table_name,
            })
        } else {
            Ok(Target::Http {
                base: url.trim_end_matches('/').to_owned(),
                http,
            })
        }
    }

    /// Activates `lock` with `token`.
    pub async fn activate(&self, lock: &LockName, token: &str) -> String {
        match self {
            Target::Http { base, http } => {
                let url = format!(
                    "{base}/v1/fences/{}/activate",
                    encode_path_segment(lock.as_str())
                );
                let response = http.post(url).header("Palisade-Token", token).send().await;
                http_outcome(response).await
            }
            Target::Postgres { fence, .. } => match fence.activate(lock, token).await {
                Ok(Activation::Activated { .. }) => "accepted".into(),
                Ok(Activation::Rejected(rejection)) => rejection.code().into(),
                Err(error) => format!("error: {error}"),
            },
        }
    }

    /// Writes `value` at `key` under `lock` with `token`.
    pub async fn write(&self, lock: &LockName, key: &str, token: &str, value: &str) -> String {
        match self {
            Target::Http { base, http } => {
                let url = kv_url(base, lock, key);
                let request = http.put(url).body(value.to_owned());
                let request = if token.is_empty() {
                    request
                } else {
                    request.header("Palisade-Token", token)
                };
                http_outcome(request.send().await).await
            }
            Target::Postgres { fence, table, .. } => {
                let outcome = if fence.mode() == FenceMode::Activated {
                    let write = palisade_fence::Write {
                        lock,
                        key,
                        token,
                        seq: None,
                        value: value.as_bytes(),
                    };
                    fence.write(write).await
                } else {
                    strict_row_write(fence, table, lock, key, token, value).await
                };
                match outcome {
                    Ok(Outcome::Accepted { .. }) => "accepted".into(),
                    Ok(Outcome::Replayed { .. }) => "replay".into(),
                    Ok(Outcome::Rejected(rejection)) => rejection.code().into(),
                    Err(error) => format!("error: {error}"),
                }
            }
        }
    }

    /// The stored value of `key` and the epoch that wrote it.
    pub async fn read(
        &self,
        lock: &LockName,
        key: &str,
    ) -> anyhow::Result<(Option<String>, Option<u64>)> {
        match self {
            Target::Http { base, http } => {
                let url = kv_url(base, lock, key);
                let response = http.get(url).send().await?;
                if response.status() == reqwest::StatusCode::NOT_FOUND {
                    return Ok((None, None));
                }
                let epoch = response
                    .headers()
                    .get("Palisade-Epoch")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok());
                Ok((Some(response.text().await?), epoch))
            }
            Target::Postgres { fence, .. } if fence.mode() == FenceMode::Activated => {
                let stored = fence.read(lock, key).await?;
                Ok(stored.map_or((None, None), |s| {
                    (
                        Some(String::from_utf8_lossy(&s.value).into_owned()),
                        Some(s.epoch.0),
                    )
                }))
            }
            Target::Postgres {
                fence, table_name, ..
            } => {
                let id = row_id(lock, key);
                let client = fence.pool().get().await?;
                let sql = format!("SELECT payload, last_fence FROM {table_name} WHERE id = $1");
                let row = client.query_opt(&sql, &[&id]).await?;
                Ok(row.map_or((None, None), |r| {
                    let fence: i64 = r.get(1);
                    (Some(r.get(0)), (fence > 0).then_some(fence as u64))
                }))
            }
        }
    }
}

/// The drill table's row of `key` under `lock` (rows are bound to their lock).
pub(crate) fn row_id(lock: &LockName, key: &str) -> String {
    format!("{lock}#{key}")
}

/// A strict-mode write of the drill table's row for `key`: the fenced update, or the fenced
/// creation of the row on its first write (then the update again if another worker created it
/// in between).
async fn strict_row_write(
    fence: &PostgresFence,
    table: &GuardedTable,
    lock: &LockName,
    key: &str,
    token: &str,
    value: &str,
) -> Result<Outcome, palisade_fence::FenceError> {
    let id = row_id(lock, key);
    let missing = |o: &Outcome| matches!(o, Outcome::Rejected(Rejection::InvalidRequest(_)));
    let updated = table.update(fence, lock, &id, token, &value).await?;
    if !missing(&updated) {
        return Ok(updated);
    }
    let created = table.insert(fence, lock, &id, token, &value).await?;
    if !missing(&created) {
        return Ok(created);
    }
    table.update(fence, lock, &id, token, &value).await
}

/// The reference store's URL of `key` under `lock`.
fn kv_url(base: &str, lock: &LockName, key: &str) -> String {
    let (lock, key) = (encode_path_segment(lock.as_str()), encode_path_segment(key));
    format!("{base}/v1/kv/{lock}/{key}")
}

async fn http_outcome(response: reqwest::Result<reqwest::Response>) -> String {
    match response {
        Ok(response) if response.status().is_success() => {
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            if body["replay"] == true {
                "replay".into()
            } else {
                "accepted".into()
            }
        }
        Ok(response) => {
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            body["error"].as_str().unwrap_or("rejected").to_owned()
        }
        Err(error) => format!("error: {error}"),
    }
}
