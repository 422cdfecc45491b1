// `sqlx::migrate!` embeds the application's migration directories at compile time; without this,
// adding a migration file would not rebuild the crate and the binaries would run without it.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
