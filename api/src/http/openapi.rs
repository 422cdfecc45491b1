//! The OpenAPI document, generated from the same route definitions that serve requests, so the
//! two cannot drift (`utoipa-axum` registers each handler and its documentation together).

use axum::Json;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::routes::{jobs, learning, live, memory, projects, sessions, skills};

#[derive(OpenApi)]
#[openapi(
    info(title = "Zuno Learning API", description = "Durable learning memory for coding agents."),
    components(schemas(super::error::Problem)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every `/api` route with its documentation.
pub(super) fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(projects::create_project, projects::list_projects))
        .routes(routes!(projects::get_project))
        .routes(routes!(projects::create_session))
        .routes(routes!(sessions::get_session, sessions::delete_session))
        .routes(routes!(sessions::append_message, sessions::list_messages))
        .routes(routes!(sessions::replace_parts))
        .routes(routes!(sessions::complete_message))
        .routes(routes!(jobs::list_jobs))
        .routes(routes!(jobs::get_job))
        .routes(routes!(learning::get_policy, learning::put_policy))
        .routes(routes!(learning::post_feedback))
        .routes(routes!(learning::reflect))
        .routes(routes!(learning::session_learning))
        .routes(routes!(live::session_learning_events))
        .routes(routes!(learning::status))
        .routes(routes!(learning::list_experiences))
        .routes(routes!(learning::get_experience))
        .routes(routes!(learning::remember))
        .routes(routes!(learning::issue))
        .routes(routes!(learning::solved))
        .routes(routes!(learning::forget))
        .routes(routes!(learning::reprocess))
        .routes(routes!(learning::repair_history))
        .routes(routes!(memory::context))
        .routes(routes!(memory::get_receipt))
        .routes(routes!(memory::search))
        .routes(routes!(memory::read, memory::update))
        .routes(routes!(memory::candidates))
        .routes(routes!(memory::approve))
        .routes(routes!(memory::reject))
        .routes(routes!(memory::undo))
        .routes(routes!(memory::inspect))
        .routes(routes!(memory::import))
        .routes(routes!(memory::revisions))
        .routes(routes!(skills::promote))
        .routes(routes!(skills::aggregate))
        .routes(routes!(skills::patterns))
        .routes(routes!(skills::global_patterns))
        .routes(routes!(skills::pattern_promote))
        .routes(routes!(skills::pattern_reject))
        .routes(routes!(skills::candidates))
        .routes(routes!(skills::get_candidate))
        .routes(routes!(skills::review))
        .routes(routes!(skills::runs))
        .routes(routes!(skills::apply))
        .routes(routes!(skills::undo))
        .routes(routes!(skills::reject))
        .route("/api/openapi.json", axum::routing::get(serve_document))
}

/// The generated document.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    api_router().split_for_parts().1
}

async fn serve_document() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi_document())
}
