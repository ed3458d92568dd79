//! Follows a channel and survives restarts of both ends: the cursor of the last
//! event printed is saved to a file, and the next run resumes from it, so
//! nothing is printed twice and nothing is skipped silently (a gap is printed
//! to stderr with the exact range).
//!
//! Run with a server on 127.0.0.1:8080 (`cargo run --release -- serve`):
//!
//! ```sh
//! cargo run -p gapless-client --example follow -- news
//! curl -d hello http://127.0.0.1:8080/v1/channels/news/events
//! ```
//!
//! Stop it with Ctrl-C, publish more, run it again: it prints exactly what it missed.

use gapless_client::{Client, Cursor, Update};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let channel = std::env::args().nth(1).unwrap_or_else(|| "news".to_owned());
    let server =
        std::env::var("GAPLESS_SERVER").unwrap_or_else(|_| "http://127.0.0.1:8080".to_owned());
    let saved = format!(".follow-{channel}.cursor");
    let client = Client::new(&server)?;
    let builder = client.subscribe([channel.as_str()]);
    let mut sub = match std::fs::read_to_string(&saved) {
        Ok(c) if !c.trim().is_empty() => builder.after(Cursor::from(c.trim().to_owned())),
        _ => builder.since_earliest(),
    }
    .open();
    while let Some(update) = sub.next().await {
        match update? {
            Update::Event(e) => println!("#{} {}", e.seq, e.data),
            Update::Gap(g) => eprintln!("gap on {} ({:?}): up to {}", g.channel, g.reason, g.next),
            Update::Ephemeral(e) => println!("(live) {}", e.data),
            Update::Presence(p) => println!("({:?}) {}", p.action, p.id),
        }
        if let Some(cursor) = sub.cursor() {
            std::fs::write(&saved, cursor.as_str())?;
        }
    }
    Ok(())
}
