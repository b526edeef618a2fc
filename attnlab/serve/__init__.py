"""`attnlab serve`: a local web page over one or two trained runs, and the JSON API under it.

- explorer.py: the model side, one run asked one input at a time: a request checked against the
  page of the run's task and answered by its view (attnlab/views/), heads switched off (``Explorer``);
- app.py: the Starlette app (the page, ``/api/info``, ``/api/run``), the request limits, and
  serving it with uvicorn on a socket bound before the models load;
- static/: the page itself, hand-written HTML, CSS and JavaScript (canvas heatmaps), no CDN, drawn
  from each run's page as ``/api/info`` describes it.
"""

# Nothing is imported from the package itself: its modules serve the commands (the command reference).
__all__: list[str] = []
