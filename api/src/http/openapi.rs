//! The OpenAPI document, generated from the same route definitions that serve requests, so the
//! two cannot drift (`utoipa-axum` registers each handler and its documentation together).

use axum::Json;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::routes::{guards, jobs, learning, live, memory, projects, sessions, skills};
use super::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "Zuno Learning API", description = "Durable learning memory for coding agents."),
    components(schemas(
        super::error::Problem,
        super::routes::live::LearningStateChanged,
        // Named by the `match` query parameter of experience search (an IntoParams field),
        // which does not register the schemas it refers to.
        zuno_shared::learning::recall::search_terms::MatchMode
    )),
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
        .routes(routes!(projects::get_project, projects::delete_project))
        .routes(routes!(projects::bind_worktree, projects::unbind_worktree))
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
        .routes(routes!(learning::embed_backfill))
        .routes(routes!(memory::context))
        .routes(routes!(memory::get_receipt))
        .routes(routes!(memory::search))
        .routes(routes!(memory::read, memory::update))
        .routes(routes!(memory::candidates))
        .routes(routes!(memory::approve))
        .routes(routes!(memory::reject))
        .routes(routes!(memory::undo))
        .routes(routes!(memory::restore))
        .routes(routes!(memory::inspect))
        .routes(routes!(memory::import))
        .routes(routes!(memory::revisions))
        .routes(routes!(memory::audit))
        .routes(routes!(guards::list))
        .routes(routes!(guards::check))
        .routes(routes!(guards::test))
        .routes(routes!(guards::approve))
        .routes(routes!(guards::reject))
        .routes(routes!(guards::disable))
        .routes(routes!(guards::enable))
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
    let mut document = api_router().split_for_parts().1;
    document_errors(&mut document);
    close_tagged_variants(&mut document, &["Part"]);
    // Exactly one of `command` and `path` (utoipa writes `max_properties` but drops
    // `min_properties`).
    if let Some(utoipa::openapi::RefOr::T(utoipa::openapi::schema::Schema::Object(object))) =
        document
            .components
            .as_mut()
            .and_then(|components| components.schemas.get_mut("TestRequest"))
    {
        object.min_properties = Some(1);
    }
    document
}

/// Marks each variant of these internally tagged enums `additionalProperties: false`, as their
/// `deny_unknown_fields` makes the server refuse unknown fields (utoipa marks structs so, but not
/// enum variants).
fn close_tagged_variants(document: &mut utoipa::openapi::OpenApi, names: &[&str]) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{AdditionalProperties, Schema};
    let Some(components) = document.components.as_mut() else {
        return;
    };
    for name in names {
        // Answers extend a part with fields of their own (`StoredPart`: `allOf` of the part and
        // its digest), so they keep the open variants.
        let open = components.schemas.get(*name).cloned();
        let reference = format!("#/components/schemas/{name}");
        for schema in components.schemas.values_mut() {
            if let RefOr::T(Schema::AllOf(all_of)) = schema {
                for item in &mut all_of.items {
                    if matches!(item, RefOr::Ref(r) if r.ref_location == reference)
                        && let Some(open) = &open
                    {
                        *item = open.clone();
                    }
                }
            }
        }
        let Some(RefOr::T(Schema::OneOf(one_of))) = components.schemas.get_mut(*name) else {
            continue;
        };
        for variant in &mut one_of.items {
            if let RefOr::T(Schema::Object(object)) = variant {
                object.additional_properties =
                    Some(Box::new(AdditionalProperties::FreeForm(false)));
            }
        }
    }
}

/// Declares the error answers every operation can give, as the problem documents they are:
/// each `Problem` response is `application/problem+json`; every operation may answer 400 (a bad
/// path or query value), 401 (no or an unknown token), 403 (a foreign `Host` or `Origin`, or
/// outside the token's scope) and 431 (an oversized request head); one that takes a body also
/// 413 and 415; one with path parameters also 404.
fn document_errors(document: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    const PROBLEM: &str = "application/problem+json";
    let problem_ref = Ref::from_schema_name("Problem");
    let problem = |description: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    PROBLEM,
                    ContentBuilder::new()
                        .schema(Some(RefOr::Ref(problem_ref.clone())))
                        .build(),
                )
                .build(),
        )
    };
    for item in document.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            for response in operation.responses.responses.values_mut() {
                if let RefOr::T(response) = response {
                    serve_problems_as_problem_json(response, &problem_ref);
                }
            }
            let has_path_parameters = operation.parameters.iter().flatten().any(|parameter| {
                matches!(
                    parameter.parameter_in,
                    utoipa::openapi::path::ParameterIn::Path
                )
            });
            let mut defaults = vec![
                ("400", "Bad request: a path or query value is not valid"),
                (
                    "401",
                    "Authentication required: no token, or an unknown or revoked one",
                ),
                (
                    "403",
                    "Refused: a foreign Host or Origin, or outside the token's scope",
                ),
                ("431", "The request's headers are too large"),
            ];
            if operation.request_body.is_some() {
                defaults.push(("413", "The request body is over the configured limit"));
                defaults.push(("415", "The body is not sent as application/json"));
            }
            if has_path_parameters {
                defaults.push(("404", "Not found (or outside the token's scope)"));
            }
            for (status, description) in defaults {
                operation
                    .responses
                    .responses
                    .entry(status.to_owned())
                    .or_insert_with(|| problem(description));
            }
        }
    }
}

/// A response whose JSON body is a `Problem` is served as `application/problem+json`.
fn serve_problems_as_problem_json(
    response: &mut utoipa::openapi::Response,
    problem_ref: &utoipa::openapi::Ref,
) {
    use utoipa::openapi::RefOr;
    let is_problem = response
        .content
        .get("application/json")
        .is_some_and(|content| {
            matches!(&content.schema, Some(RefOr::Ref(r))
                if r.ref_location == problem_ref.ref_location)
        });
    if !is_problem {
        return;
    }
    if let Some(content) = response.content.shift_remove("application/json") {
        response
            .content
            .insert(String::from("application/problem+json"), content);
    }
    if response.description.is_empty() {
        response.description = String::from("A problem document");
    }
}

async fn serve_document() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi_document())
}
