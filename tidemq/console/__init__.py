"""``tidemq console``: the web console, served by the console process itself (aiohttp and Jinja2
on the server, Pico CSS and uPlot in the page). It reads the cluster with the SDK's admin client,
keeps an hour of rates and lag from its own samples (``history``), and makes changes only for a
signed-in admin, each confirmed and logged (``writes``). docs/console.md shows what it does."""
