//! The README's "From Rust" snippet, compiled with the workspace (`cargo build --examples`, and
//! clippy's `--all-targets`); `crates/cli/tests/it/docs_blocks.rs` checks that the README shows these lines.
//!
//! Run it against a coordinator on the default port:
//! `cargo run -p palisade-client --example quickstart`.

/// Whether the resource accepted the write (a fenced resource refuses an obsolete token).
async fn send_to_resource(token: &str) -> bool {
    println!("a write carrying {} bytes of token", token.len());
    true
}

async fn work() {
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

fn abort(reason: String) {
    eprintln!("lease lost: {reason}; stopping the work");
}

#[tokio::main]
async fn main() -> Result<(), palisade_client::ClientError> {
    // README: begin
    let client = palisade_client::Client::connect(&["http://127.0.0.1:7420"]).await?;
    let mut lease = client
        .acquire(palisade_client::AcquireOptions::new("report/7"))
        .await?;
    if lease.is_valid() {
        // Checked before the write, no protection by itself: the resource checks the token.
        if !send_to_resource(lease.token()).await {
            abort("the resource refused: a newer owner wrote".into()); // stop, do not retry
        }
    }
    tokio::select! { reason = lease.lost() => abort(reason), _ = work() => {} }
    lease.release().await?;
    // README: end
    Ok(())
}
