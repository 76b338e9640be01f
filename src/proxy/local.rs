//! The main listener's routes answered without a charge: `POST /tokenize` (locally, in
//! vLLM's shape) and `GET /v1/models` (from the backends). Both come after the authenticate
//! layer, whose `Arc<Tenant>` they find in the request's extensions.

use super::{full, json_response, Gateway, GatewayBody, REQUEST_ID};
use crate::api::openai::{self, Prompt};
use crate::error::ApiError;
use crate::layers::count::render_paired;
use crate::tenant::Tenant;
use crate::tokenize::chat::ChatRoute;
use crate::vision;
use http::{Method, Request, Response, StatusCode};
use std::sync::Arc;

/// `POST /tokenize`, answered locally in vLLM's shape: `{"count", "max_model_len", "tokens"}`.
pub async fn tokenize<B>(
    gw: Arc<Gateway>,
    req: Request<B>,
) -> Result<Response<GatewayBody>, ApiError>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tenant = crate::layers::needs::<Arc<Tenant>>(req.extensions())?.clone();
    let config = gw.config.clone();
    let prompt = gw
        .read_json(&tenant.name, req, move |body| {
            let body = body.object;
            if let Some(v) = body.get("model").filter(|v| !v.is_null()) {
                let m = v.as_str().unwrap_or_default();
                if !config.model.served_names.iter().any(|n| n == m) {
                    return Err(ApiError::model_not_found(m));
                }
            }
            if body.contains_key("messages") {
                openai::parse_chat_prompt(&body, &config.vision_rules, ChatRoute::Tokenize)
            } else {
                openai::parse_completion_prompt(&body)
            }
        })
        .await?;
    let ids = gw.encode_prompt(&tenant.name, prompt).await?;
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({
            "count": ids.len(),
            "max_model_len": gw.config.model.max_model_len,
            "tokens": ids,
        }),
    ))
}

/// `GET /v1/models`, from the first backend that answers with a 2xx (a 4xx is passed on in
/// OpenAI's shape; a backend that fails is skipped).
pub async fn models<B>(
    gw: Arc<Gateway>,
    req: Request<B>,
) -> Result<Response<GatewayBody>, ApiError> {
    let request_id = req.headers().get(REQUEST_ID);
    let mut last = ApiError::upstream("no backend is configured");
    for upstream in &gw.upstreams {
        let answer = async {
            let resp = upstream
                .send(Method::GET, "/v1/models", None, request_id)
                .await?;
            let (mut parts, body) = resp.into_parts();
            if !parts.status.is_success() {
                return Err(upstream.refusal(parts.status, body).await);
            }
            let bytes = upstream.read_answer(body).await?;
            super::upstream::answer_headers(&mut parts.headers);
            Ok(Response::from_parts(parts, full(bytes)))
        };
        match answer.await {
            Err(e) if e.status.is_server_error() => last = e,
            done => return done,
        }
    }
    Err(last)
}

impl Gateway {
    /// The ids the engine will run (for `/tokenize`): a chat rendered, encoded and its image
    /// and video placeholders expanded, so their number is what the counting layer charges.
    pub async fn encode_prompt(&self, tenant: &str, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
        let tok = self.tokenizer.clone();
        let chat = self.chat.clone();
        self.pool
            .run(tenant, move || match prompt {
                Prompt::Chat { prompt, media } => {
                    let ids = tok.encode(&render_paired(&chat, &prompt, &media)?);
                    vision::expand_ids(ids, &media, &tok).map_err(ApiError::invalid)
                }
                Prompt::Text(t) => Ok(tok.encode(&t)),
                Prompt::TokenIds(ids) => Ok(ids),
            })
            .await?
    }
}
