//! What several rooms use and none owns: bounded (and paced) reads of a body, a bounded HTTP
//! GET, decimal writing.

pub mod bounded;
pub mod decimal;
pub mod get;
