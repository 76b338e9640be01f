//! What the capacity model refuses: an unknown profile, or an input outside the range its
//! formulas hold for.

/// Why capacity inputs were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CapacityError {
    /// No built-in hardware profile by that name.
    #[error("unknown hardware profile {name:?} (known: {known})")]
    UnknownHardware {
        /// The name asked for.
        name: String,
        /// The built-in names.
        known: String,
    },
    /// No built-in model profile by that name.
    #[error("unknown model profile {name:?} (known: {known})")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The built-in names.
        known: String,
    },
    /// An input outside the range the formulas hold for.
    #[error("invalid {field}: {message}")]
    Invalid {
        /// The offending input.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
}

impl CapacityError {
    pub(crate) fn invalid(field: &'static str, message: String) -> Self {
        CapacityError::Invalid { field, message }
    }
}
