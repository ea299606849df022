//! Parquet output: one file per case × model, one row per scored position
//! (kld cases) or per digit (teacher-forcing cases).
//! The only user of the `parquet` crate.
//!
//! Contract: written to a temp file beside the destination, read back (row
//! count checked) before it is fsynced and renamed into place; a failure at
//! any step leaves no file under the final name and removes the temp file.

use crate::core::error::{Error, Result};
use crate::core::fsutil::{commit, temp_beside};
use crate::core::{Column, Table};
use parquet::basic::Compression;
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int32Type};
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// One column's values, as the writer takes them.
enum Col {
    Str(Vec<ByteArray>),
    I32(Vec<i32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
}

/// The Parquet schema of `table` behind the `case`, `model` and
/// `model_sha256` columns: every column required.
pub(crate) fn schema(table: &Table) -> String {
    let mut s = format!(
        "message {} {{\n  REQUIRED BYTE_ARRAY case (UTF8);\n  REQUIRED BYTE_ARRAY model (UTF8);\n  REQUIRED BYTE_ARRAY model_sha256 (UTF8);\n",
        table.name
    );
    for (name, col) in &table.columns {
        let ty = match col {
            Column::Str(_) => "BYTE_ARRAY",
            Column::I32(_) => "INT32",
            Column::F64(_) => "DOUBLE",
            Column::Bool(_) => "BOOLEAN",
        };
        let utf8 = if matches!(col, Column::Str(_)) {
            " (UTF8)"
        } else {
            ""
        };
        s.push_str(&format!("  REQUIRED {ty} {name}{utf8};\n"));
    }
    s.push('}');
    s
}

/// Write the rows of one case × model to `dest` atomically.
pub(crate) fn write_table(
    dest: &Path,
    case: &str,
    model: &str,
    model_sha256: &str,
    table: &Table,
) -> Result<()> {
    let n = table.rows().ok_or_else(|| {
        Error::harness(format!(
            "{}: incomplete per-position rows (columns of different lengths)",
            dest.display()
        ))
    })?;
    let s = |v: &str| Col::Str(vec![ByteArray::from(v); n]);
    let mut cols = vec![s(case), s(model), s(model_sha256)];
    for (_, c) in &table.columns {
        cols.push(match c {
            Column::Str(v) => Col::Str(v.iter().map(|x| ByteArray::from(x.as_str())).collect()),
            Column::I32(v) => Col::I32(v.clone()),
            Column::F64(v) => Col::F64(v.clone()),
            Column::Bool(v) => Col::Bool(v.clone()),
        });
    }
    write_atomic(dest, &schema(table), cols, n)
}

/// Write `cols` under `schema` to `dest`: temp file, read back, rename.
fn write_atomic(dest: &Path, schema: &str, cols: Vec<Col>, n: usize) -> Result<()> {
    let tmp = temp_beside(dest)?;
    write_file(tmp.path(), schema, cols)?;
    let rows_back = read_row_count(tmp.path())?;
    if rows_back != n as i64 {
        return Err(Error::harness(format!(
            "{}: read back {rows_back} rows, wrote {n}",
            tmp.path().display()
        )));
    }
    commit(tmp, dest)
}

fn pq(path: &Path, e: parquet::errors::ParquetError) -> Error {
    Error::harness(format!("{}: parquet: {e}", path.display()))
}

fn write_file(path: &Path, schema: &str, cols: Vec<Col>) -> Result<()> {
    let schema = Arc::new(parse_message_type(schema).map_err(|e| pq(path, e))?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let mut writer = SerializedFileWriter::new(file, schema, props).map_err(|e| pq(path, e))?;
    let mut rg = writer.next_row_group().map_err(|e| pq(path, e))?;
    for col in &cols {
        let mut cw = rg.next_column().map_err(|e| pq(path, e))?.ok_or_else(|| {
            Error::harness(format!("{}: schema has fewer columns", path.display()))
        })?;
        match col {
            Col::Str(v) => cw.typed::<ByteArrayType>().write_batch(v, None, None),
            Col::I32(v) => cw.typed::<Int32Type>().write_batch(v, None, None),
            Col::F64(v) => cw.typed::<DoubleType>().write_batch(v, None, None),
            Col::Bool(v) => cw.typed::<BoolType>().write_batch(v, None, None),
        }
        .map_err(|e| pq(path, e))?;
        cw.close().map_err(|e| pq(path, e))?;
    }
    rg.close().map_err(|e| pq(path, e))?;
    writer.close().map_err(|e| pq(path, e))?;
    Ok(())
}

/// Rows in a Parquet file, from its footer.
pub(crate) fn read_row_count(path: &Path) -> Result<i64> {
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
    let r = SerializedFileReader::new(f).map_err(|e| pq(path, e))?;
    Ok(r.metadata().file_metadata().num_rows())
}
