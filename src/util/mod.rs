//! What several rooms use and none owns: bounded (and paced) reads of a body, decimal writing.

pub mod bounded;
pub mod decimal;
