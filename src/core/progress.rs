//! Progress bars on stderr for the long steps (hashing, fetching, decoding),
//! drawn only when stderr is a terminal: logs and CI output stay clean.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `len` units named `msg`; `unit` is `bytes` (sizes and ETA) or
/// the plural of what is counted (`windows`).
pub fn bar(len: u64, msg: &str, unit: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let template = if unit == "bytes" {
        "{msg:>24} [{bar:30}] {bytes}/{total_bytes} {eta}".to_string()
    } else {
        format!("{{msg:>24}} [{{bar:30}}] {{pos}}/{{len}} {unit} {{eta}}")
    };
    bar.set_style(
        ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(msg.to_string());
    bar
}
