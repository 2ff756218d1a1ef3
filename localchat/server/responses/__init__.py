"""OpenAI's Responses API (`/v1/responses`) on the chat path: requests and their input items become
chat completions (`translate.py`), replies become output items and the API's events
(`reply.py`), and responses are kept (`store.py`) for `previous_response_id` and
`GET /v1/responses/{id}`."""
