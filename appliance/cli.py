"""`appliance VERB [key=value ...]`: the command line. Every verb takes Hydra overrides."""
import argparse
import os
import signal
import sys
from typing import List, Optional


from appliance import __version__
from appliance.display import show
from appliance.errors import ConfigError, UserError
from appliance.gc_tuning import settle_heap
from appliance.logs import SERVE_LEVEL, setup_logging
from appliance.serving.http.route_table import routes_help

VERBS = {
    "run": "run the pipeline offline on `input=...` and write or print its results",
    "serve": "serve the pipeline over HTTP on server.host:server.port",
    "config": "print the composed, resolved config as YAML",
    "check": "make every check run and serve make before they load a model, and print ok or run's error",
    "assemble": "build a search's collection, mosaic and summary once its shares (search.shares) are all mapped",
}


RUN_HELP = """\
keys a run takes (besides any config key; `appliance config pipeline=NAME` prints them all):
  input=PATH | input=[A,B]   flood: GeoTIFF scenes (paths, http(s) or s3:// URLs, STAC items; several as a
                             list in brackets, no spaces); chat: an image (a path or URL), or an OpenAI
                             batch file (.jsonl)
  output=PATH                flood: a .tif file (one input) or a directory; left out, each mask goes
                             beside its input as <name>.mask.tif (refused for inputs inside the
                             installed package, such as its samples). chat: answers are printed; a
                             .jsonl input needs output=answers.jsonl
  overwrite=true             replace output files that exist (each is written whole, then moved into place)
  aoi=[XMIN,YMIN,XMAX,YMAX]  flood: map only this area of interest, in lon/lat degrees unless aoi_crs is
                             given; the mask is that window of the scene
  aoi_crs=CRS                flood: the CRS of aoi's numbers, e.g. aoi_crs=EPSG:32615 (default EPSG:4326)
  date=YYYY-MM-DD            flood: the scenes' acquisition date, for models with a time encoding (TL);
                             default: the source's (STAC datetime, date tags, HLS file name)
  prompt=TEXT                chat: the question about the image, taken as the shell passes it (quotes,
                             commas, brackets, = and ${...} included): quote it for the shell only
  prompt_file=PATH           chat: the question read from a UTF-8 text file, instead of prompt=
  system=TEXT                chat: a system message before the question, taken as the shell passes it
  search.url=URL             flood, burn scars, crops: instead of input=, the scenes a STAC API search
                             finds (docs/geo.md, "Scenes from a STAC API search"); `check` lists them
  search.collections=[A,B]   collection ids to search, e.g. [HLSS30_2.0]; left out: all
  search.bbox=[W,S,E,N]      the area searched, in lon/lat; left out: the run's aoi
  search.datetime=START/END  ISO 8601 dates or times (.. for an open end), or one date
  search.max_cloud_cover=N   percent: items with more eo:cloud_cover are left out
  search.max_items=N         at most N items in all
  search.page_size=N         items per page the API is asked for (every page is read)
  search.api_timeout_s=S     each request to the API must be answered within S seconds
  search.shares=N            split the search's scenes over N processes (a Kubernetes Indexed Job's
                             completions); each maps its share, `appliance assemble` builds the region
  search.share=I             this process's share, 0 to N-1; default: $JOB_COMPLETION_INDEX

examples:
  appliance run pipeline=prithvi_flood input=scene.tif output=mask.tif
  appliance run pipeline=prithvi_flood input=[a.tif,b.tif] output=masks/ aoi=[-91.2,29.9,-90.9,30.2]
  appliance run pipeline=llava_chat input=photo.png prompt="What's in this picture? (one line)"
  appliance run pipeline=llava_chat input=requests.jsonl output=answers.jsonl overwrite=true
  appliance run pipeline=prithvi_flood search.url=https://cmr.earthdata.nasa.gov/stac/LPCLOUD \
    search.collections=[HLSS30_2.0] search.bbox=[-91.2,29.9,-90.9,30.2] search.datetime=2024-06-01/2024-06-30
"""

CHECK_HELP = """\
checks, without loading weights, what `run` and `serve` check before they load a model: the config (every
key and stage option), the model's files, the stage graph, the server.* settings, and, when a run's keys
are given (input=, output=, prompt=, ...), the run's inputs and outputs as its stages read them: GeoTIFF
headers against the model's bands and dates, aoi against the scene, date, images decoded within
server.limits, every line of a .jsonl batch, prompt_file, the prompt a chat needs, where outputs go
(a missing output directory is created, as run creates it). URLs are left to the run. Prints one `ok:`
line, or `run`'s (or `serve`'s) one-line error with exit code 2.

examples:
  appliance check pipeline=prithvi_flood model=prithvi_300m_tl_flood model.checkpoint=/models/flood.pt
  appliance check pipeline=llava_chat model=llava_1_5_7b model.path=/models/llava-1.5-7b-hf
  appliance check pipeline=prithvi_flood input=scene.tif output=mask.tif
  appliance check pipeline=llava_chat input=requests.jsonl output=answers.jsonl
"""

ASSEMBLE_HELP = """\
after the shares of a search (search.shares=N, each run with search.share=I or in an Indexed Job) have
mapped their scenes into output=DIR/: runs the same search, checks that every scene's mask and STAC item
in DIR are complete, and builds DIR/collection.json, DIR/mosaic.tif and DIR/summary.json from them.
Loads no model. Scenes not complete are named (exit code 2): run their shares again, then assemble.

example (the same keys as the shares, search.share left out):
  appliance assemble pipeline=prithvi_flood search.url=URL search.collections=[HLSS30_2.0] \\
    search.bbox=[-91.2,29.9,-90.9,30.2] search.datetime=2024-06-01/2024-06-30 search.shares=3 output=masks/
"""

CONFIG_HELP = """\
prints the config a run or server would use, as YAML, every value spelled out: stage options as the
stages resolve them (a tile size left unset is the model's), and the checkpoint's facts (context length,
image token) where the config leaves them null. A value that is not its default ends with a comment
saying where it came from:
  # model: model.geo.tile_size   a fact of the model        # pipeline: NAME   the pipeline's YAML
  # derived: tile_size // 8      a stage's rule             # override         the command line
A starting point for a config file of your own (conf/pipeline/*.yaml hold only what differs).

examples:
  appliance config pipeline=llava_chat
  appliance config pipeline=prithvi_flood pipeline.stages.tile.overlap=64
  appliance config pipeline=llava_chat engine=cuda server.port=8001
"""

SERVE_HELP = f"""\
listens on http://SERVER.HOST:SERVER.PORT (default http://127.0.0.1:8000; server.host=0.0.0.0 for
every interface) and answers, by the pipeline's engine kind ((open): answered without server.api_key):
{routes_help()}
docs/serving.md lists every route, field, limit and metric.

examples:
  appliance serve pipeline=llava_chat
  appliance serve pipeline=prithvi_flood server.port=8001 server.allowed_local_media_dir=/data
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="appliance",
        description="Declarative serving appliance. Overrides use Hydra syntax: pipeline=NAME model=NAME key=value.",
    )
    parser.add_argument("--version", action="version", version=f"appliance {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    epilogs = {"run": RUN_HELP, "serve": SERVE_HELP, "check": CHECK_HELP, "config": CONFIG_HELP,
               "assemble": ASSEMBLE_HELP}
    for verb, help_text in VERBS.items():
        epilog = _pipelines_help() + epilogs.get(verb, "")
        p = sub.add_parser(verb, help=help_text, description=help_text, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="a Hydra override: pipeline=NAME, model=NAME, engine=NAME or key=value")
    return parser


def _pipelines_help() -> str:
    """`pipeline=NAME` choices, each with the first line of its file's header comment."""
    from appliance.config.compose import conf_dir, group_options

    lines = ["pipelines (pipeline=NAME):"]
    for name in group_options("pipeline"):
        path = conf_dir() / "pipeline" / f"{name}.yaml"
        about = next((line.lstrip("# ").strip() for line in _header(path) if not line.startswith("# @")), "")
        lines.append(f"  {name:<26} {about}")
    return "\n".join(lines) + "\n\n"


def _header(path) -> List[str]:
    """The comment lines a config file starts with (nothing when it cannot be read)."""
    try:
        with open(path) as f:
            return [line.rstrip() for line in iter(f.readline, "") if line.startswith("#")][:3]
    except OSError:
        return []


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.verb == "run":  # unwind on Ctrl-C and SIGTERM, so writers remove their temp files
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _terminate)
    try:
        return _dispatch(args.verb, args.overrides)
    except UserError as e:
        print(f"appliance {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _stopped(args.verb, "interrupted", 130)
    except Terminated:
        return _stopped(args.verb, "terminated", 143)


def _stopped(verb: str, word: str, code: int) -> int:
    print(f"appliance {verb}: {word}", file=sys.stderr)
    if verb != "run":
        return code
    # The run has unwound (its writers removed their temp files): leave now, with this code. Through
    # sys.exit, CPython sometimes turns a KeyboardInterrupt we handled into a kill by SIGINT at exit
    # (`_Py_UnhandledKeyboardInterrupt`, set when the signal lands in some of its C paths): exit -2,
    # not 130, about 1 run in 8 with Ctrl-C pressed three times (strace: SIG_DFL, then kill(self)).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _dispatch(verb: str, overrides: List[str]) -> int:
    from appliance.config.compose import compose

    cfg = compose(overrides)
    setup_logging(cfg.log_level or (SERVE_LEVEL if verb == "serve" else "WARNING"), cfg.log_format)
    if verb == "config":
        from appliance.config.provenance import config_yaml

        print(config_yaml(cfg, overrides), end="")
        return 0
    if verb == "assemble":  # builds outputs from masks made before: no model, no stage runs
        from appliance.stages.build import build_stages
        from appliance.stages.geo.region_assemble import assemble

        for line in assemble(cfg, build_stages(cfg)):
            show("region: " + line)
        return 0

    from appliance.config.run_inputs import names_a_run, run_record
    from appliance.model_files import check_model_files
    from appliance.stages.build import build_pipeline

    check_model_files(cfg.model)
    pipeline = build_pipeline(cfg)
    if verb == "serve":
        _check_servable(cfg, pipeline)
        from appliance.serving.server import serve

        return serve(cfg, pipeline)  # its settings, then the model's files, then the model
    # What the run's stages would refuse before they set up (inputs, outputs, prompts), found before
    # Pipeline.check reads the model's files: such a mistake costs the config's time, not the model's.
    record = run_record(cfg)
    done, records = pipeline.preflight([record]) if verb == "run" or names_a_run(record) else (0, [record])
    if verb == "check":
        from appliance.serving.startup import check_server_settings

        check_server_settings(cfg)
        pipeline.check()
        from appliance.stages.geo.search_scenes import search_listing

        for line in search_listing(cfg):  # a search's items: what would run, what is skipped and why
            print(line)
        names = " -> ".join(stage.name for stage in pipeline.stages)
        print(f"ok: pipeline {cfg.pipeline.name} ({names}), model {cfg.model.name}")
        return 0
    return _run(pipeline, records, done)


def _check_servable(cfg, pipeline) -> None:
    """A pipeline whose online stages the server cannot feed (its stage graph needs what only the offline
    sources make) is for `appliance run` only: say so, with the reason after."""
    from appliance.serving.online_stages import split_online

    try:
        split_online(pipeline, cfg)
    except ConfigError as e:
        raise ConfigError(f"pipeline {cfg.pipeline.name} is offline only: use `appliance run` "
                          f"(the server cannot run it: {e})") from None


def _run(pipeline, records, start: int) -> int:
    """Run the stages from `start` on: those before it made `records` in the preflight already."""
    pipeline.check()
    stream = pipeline.run(records, start)
    try:
        for count, result in enumerate(stream):
            if count == 0:
                settle_heap()  # every stage is set up (lazily) once a result came out
            if result.get("display") is not None:
                show(result["display"])  # a chat answer as Markdown on a terminal, as written when piped
    finally:
        stream.close()  # closes every stage's generator now: their cleanup runs before we exit
        pipeline.close()
    return 0


class Terminated(BaseException):
    """SIGTERM during `run` (not an Exception: no stage may swallow it)."""


def _interrupt(signum, frame):
    _ignore_signals()
    raise KeyboardInterrupt()


def _terminate(signum, frame):
    _ignore_signals()
    raise Terminated()


def _ignore_signals() -> None:
    """The run is unwinding: a second Ctrl-C or SIGTERM must not cut its cleanup short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
