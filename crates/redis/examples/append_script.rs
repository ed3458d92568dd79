//! Prints the append script's Lua source, for `redis-cli SCRIPT LOAD`.
//! Run with `cargo run -p gapless-redis --example append_script`.

fn main() {
    print!("{}", gapless_redis::append_script());
}
