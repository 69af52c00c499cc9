"""The `Link: rel="next"` header a page of a listing carries when another page may follow."""

from __future__ import annotations

from fastapi import Request, Response


def link_next(request: Request, response: Response, last: str | int) -> None:
    """The next page, as a reference relative to this one (query only), so it holds under
    RIG_HTTP_ROOT_PATH whether the ingress strips the prefix or not."""
    query = request.url.include_query_params(after=last).query
    response.headers["Link"] = f'<?{query}>; rel="next"'
