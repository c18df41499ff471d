//! `palisade bench acquire --compare NAME=URL`: the same lock workload against another lock
//! service, in the same run, so the ratio can be reproduced anywhere.
//!
//! - `redis=redis://HOST:PORT`: the usual single-instance Redis lock: `SET key token NX PX ttl`
//!   to acquire, a Lua check-and-delete to release. No fencing token. Durable only when the
//!   server runs with `appendonly yes` and `appendfsync always` (`scripts/bench-compare` starts
//!   it so).
//! - `etcd=http://HOST:PORT`: etcd's v3 JSON gateway. Each client grants one lease (its
//!   session, as etcd's own lock recipe does); acquire is a transaction that puts the key with
//!   that lease if it does not exist, release a transaction that deletes it if it still holds
//!   the client's value. Every write is durable before its answer (etcd's default).
//!
//! Neither queues waiters: a client that finds the lock held tries again after
//! [`RETRY_AFTER`] (Palisade's clients wait in the coordinator's queue instead). The cycle,
//! its latency and the hand-offs are counted as for Palisade.

use std::time::Duration;

use anyhow::{bail, Context as _};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufStream};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::cycle::{Cycle, MAX_SAMPLES_PER_CLIENT};

/// How long a client that found the lock held waits before it tries again.
pub const RETRY_AFTER: Duration = Duration::from_millis(1);
/// Lock TTL given to the other services (as Palisade's bench clients ask for).
const TTL: Duration = Duration::from_secs(10);
/// Longest reply line or bulk string read from Redis.
const MAX_REPLY: usize = 1 << 20;

/// Release only while still the holder (the standard Redis lock release).
const RELEASE_SCRIPT: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// A service to compare with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `redis=redis://HOST:PORT`.
    Redis(String),
    /// `etcd=http://HOST:PORT`.
    Etcd(String),
}

impl Target {
    /// Parses `NAME=URL`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (name, url) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: expected NAME=URL (redis=… or etcd=…)"))?;
        match name {
            "redis" => {
                let address = url
                    .strip_prefix("redis://")
                    .ok_or_else(|| format!("{url:?}: a Redis URL is redis://HOST:PORT"))?;
                Ok(Target::Redis(address.trim_end_matches('/').to_owned()))
            }
            "etcd" => {
                if !url.starts_with("http://") {
                    return Err(format!("{url:?}: an etcd URL is http://HOST:PORT"));
                }
                Ok(Target::Etcd(url.trim_end_matches('/').to_owned()))
            }
            other => Err(format!("{other:?}: can compare with redis or etcd")),
        }
    }

    /// Its name in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Target::Redis(_) => "redis",
            Target::Etcd(_) => "etcd",
        }
    }

    /// Where it is.
    pub fn url(&self) -> String {
        match self {
            Target::Redis(address) => format!("redis://{address}"),
            Target::Etcd(url) => url.clone(),
        }
    }
}

/// Runs one client's cycles against `target` until `deadline`; returns its cycles and errors.
pub async fn client_loop(
    target: Target,
    index: usize,
    locks: usize,
    started: Instant,
    deadline: Instant,
) -> anyhow::Result<(Vec<Cycle>, usize)> {
    let lock = index % locks;
    let key = format!("bench/{lock}");
    let value = format!("bench-{index}-{}", std::process::id());
    let mut session = Session::open(&target).await?;
    let mut cycles = Vec::new();
    let mut errors = 0;
    while Instant::now() < deadline && cycles.len() < MAX_SAMPLES_PER_CLIENT {
        let acquire_sent = Instant::now();
        loop {
            match session.try_acquire(&key, &value).await {
                Ok(true) => break,
                Ok(false) => tokio::time::sleep(RETRY_AFTER).await,
                Err(error) => {
                    errors += 1;
                    tracing::debug!(%error, "acquire failed");
                    // A broken connection: open another one.
                    session = Session::open(&target).await?;
                }
            }
            if Instant::now() >= deadline {
                return Ok((cycles, errors));
            }
        }
        let granted = Instant::now();
        let release_sent = Instant::now();
        match session.release(&key, &value).await {
            Ok(true) => {}
            Ok(false) => bail!("{}: the lock {key} was lost while held", target.name()),
            Err(error) => {
                errors += 1;
                tracing::debug!(%error, "release failed");
                session = Session::open(&target).await?;
                continue;
            }
        }
        cycles.push(Cycle {
            lock,
            // One holder at a time: the grant's time orders the holders of a lock.
            epoch: granted.duration_since(started).as_nanos() as u64,
            acquire_sent,
            granted,
            release_sent,
            released: Instant::now(),
        });
    }
    Ok((cycles, errors))
}

/// One client's connection to a target.
enum Session {
    Redis(Redis),
    Etcd(Etcd),
}

impl Session {
    async fn open(target: &Target) -> anyhow::Result<Self> {
        Ok(match target {
            Target::Redis(address) => Session::Redis(Redis::connect(address).await?),
            Target::Etcd(url) => Session::Etcd(Etcd::connect(url).await?),
        })
    }

    /// True when acquired, false when held by another client.
    async fn try_acquire(&mut self, key: &str, value: &str) -> anyhow::Result<bool> {
        match self {
            Session::Redis(redis) => {
                let ttl = TTL.as_millis().to_string();
                let reply = redis.call(&["SET", key, value, "NX", "PX", &ttl]).await?;
                Ok(matches!(reply, Reply::Simple(ref s) if s == "OK"))
            }
            Session::Etcd(etcd) => etcd.put_if_absent(key, value).await,
        }
    }

    /// True when released, false when the lock was no longer this client's.
    async fn release(&mut self, key: &str, value: &str) -> anyhow::Result<bool> {
        match self {
            Session::Redis(redis) => {
                let reply = redis
                    .call(&["EVAL", RELEASE_SCRIPT, "1", key, value])
                    .await?;
                Ok(matches!(reply, Reply::Integer(1)))
            }
            Session::Etcd(etcd) => etcd.delete_if_mine(key, value).await,
        }
    }
}

/// A Redis reply (the kinds a lock needs).
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
}

/// A RESP2 connection.
struct Redis {
    stream: BufStream<TcpStream>,
}

impl Redis {
    async fn connect(address: &str) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(address)
            .await
            .with_context(|| format!("cannot connect to Redis at {address}"))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufStream::new(stream),
        })
    }

    async fn call(&mut self, args: &[&str]) -> anyhow::Result<Reply> {
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        self.stream.write_all(request.as_bytes()).await?;
        self.stream.flush().await?;
        let line = self.line().await?;
        let (kind, rest) = line.split_at(1);
        match kind {
            "+" => Ok(Reply::Simple(rest.to_owned())),
            "-" => bail!("Redis: {rest}"),
            ":" => Ok(Reply::Integer(rest.parse()?)),
            "$" => {
                let length: i64 = rest.parse()?;
                if length < 0 {
                    return Ok(Reply::Bulk(None));
                }
                anyhow::ensure!((length as usize) < MAX_REPLY, "Redis: reply too long");
                let mut bytes = vec![0; length as usize + 2];
                self.stream.read_exact(&mut bytes).await?;
                bytes.truncate(length as usize);
                Ok(Reply::Bulk(Some(bytes)))
            }
            other => bail!("Redis: unexpected reply kind {other:?}"),
        }
    }

    async fn line(&mut self) -> anyhow::Result<String> {
        let mut line = String::new();
        let read = (&mut self.stream)
            .take(MAX_REPLY as u64)
            .read_line(&mut line)
            .await?;
        anyhow::ensure!(read > 0, "Redis closed the connection");
        anyhow::ensure!(line.ends_with("\r\n") && line.len() > 2, "Redis: bad reply");
        line.truncate(line.len() - 2);
        Ok(line)
    }
}

/// A client of etcd's v3 JSON gateway, with one lease (its session).
struct Etcd {
    http: reqwest::Client,
    url: String,
    lease: String,
}

impl Etcd {
    async fn connect(url: &str) -> anyhow::Result<Self> {
        // One connection per client, as each Palisade bench client has its own.
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .tcp_nodelay(true)
            .build()?;
        let mut etcd = Self {
            http,
            url: url.to_owned(),
            lease: String::new(),
        };
        let granted = etcd
            .post("lease/grant", serde_json::json!({"TTL": TTL.as_secs()}))
            .await
            .with_context(|| format!("cannot grant an etcd lease at {url}"))?;
        etcd.lease = match &granted["ID"] {
            serde_json::Value::String(id) => id.clone(),
            serde_json::Value::Number(id) => id.to_string(),
            other => bail!("etcd: lease grant answered {other}"),
        };
        Ok(etcd)
    }

    async fn post(&self, path: &str, body: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let response = self
            .http
            .post(format!("{}/v3/{path}", self.url))
            .json(&body)
            .send()
            .await?;
        let status = response.status();
        let body: serde_json::Value = response.json().await?;
        anyhow::ensure!(status.is_success(), "etcd: {status}: {body}");
        Ok(body)
    }

    async fn put_if_absent(&self, key: &str, value: &str) -> anyhow::Result<bool> {
        let key = B64.encode(key);
        self.transaction(
            serde_json::json!({"key": key, "target": "CREATE", "create_revision": "0"}),
            serde_json::json!({"request_put": {
                "key": key, "value": B64.encode(value), "lease": self.lease,
            }}),
        )
        .await
    }

    async fn delete_if_mine(&self, key: &str, value: &str) -> anyhow::Result<bool> {
        let key = B64.encode(key);
        self.transaction(
            serde_json::json!({"key": key, "target": "VALUE", "value": B64.encode(value)}),
            serde_json::json!({"request_delete_range": {"key": key}}),
        )
        .await
    }

    /// A transaction of one compare and one request on success; true when it succeeded.
    async fn transaction(
        &self,
        compare: serde_json::Value,
        success: serde_json::Value,
    ) -> anyhow::Result<bool> {
        let answer = self
            .post(
                "kv/txn",
                serde_json::json!({"compare": [compare], "success": [success]}),
            )
            .await?;
        Ok(answer["succeeded"] == serde_json::Value::Bool(true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_bad_ones_are_refused() {
        assert_eq!(
            Target::parse("redis=redis://127.0.0.1:6379").unwrap(),
            Target::Redis("127.0.0.1:6379".into())
        );
        assert_eq!(
            Target::parse("etcd=http://127.0.0.1:2379/").unwrap(),
            Target::Etcd("http://127.0.0.1:2379".into())
        );
        for bad in [
            "redis",
            "redis=127.0.0.1:6379",
            "etcd=https://x:1",
            "consul=http://x:1",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
