#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub mod core;
pub mod engine;
pub mod execute;
pub mod golden;
pub mod harness;
pub mod judge;
pub mod kinds;
pub mod measure;
pub mod models;
pub mod plan;
pub mod report;
pub mod schedule;
