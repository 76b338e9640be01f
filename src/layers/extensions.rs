//! How a layer reads what the layers before it left in a request's extensions.

use crate::error::ApiError;
use http::Extensions;

/// What a layer needs from the request's extensions; missing, it is a stack built in the wrong
/// order (a 500 naming the type).
pub(crate) fn needs<T: Send + Sync + 'static>(extensions: &Extensions) -> Result<&T, ApiError> {
    extensions
        .get::<T>()
        .ok_or_else(|| ApiError::missing_extension(std::any::type_name::<T>()))
}
