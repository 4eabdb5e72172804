"""The map page of a multi-date model (`GET /` of `pipeline=prithvi_crops`, 3 dates) in a real browser: it
learns the count from GET v1/scenes and shows a labelled file picker and date field per date in place of the
one date field; the three sample dates picked there go as one multipart form (with their dates, which reach
the mask) and give the map, legend and class counts of the stacked sample sent through the one-file
picker with the same dates (as `?date=d1,d2,d3`); only some dates given is refused on the page; dates
dropped together fill the pickers in name order."""
import io

import httpx
import pytest
import rasterio

from tests.conftest import REPO
from tests.server_process import server_process
from tests.ui.conftest import PHONE

SAMPLES = REPO / "appliance" / "assets" / "samples"
DATES = [SAMPLES / f"crops_sample_date{i}.tif" for i in (1, 2, 3)]
STACKED = SAMPLES / "crops_sample_stacked.tif"
GIVEN = ["2022-05-01", "2022-06-01", "2022-08-01"]


@pytest.fixture(scope="module")
def crops_server(tmp_path_factory):
    with server_process("pipeline=prithvi_crops", cwd=tmp_path_factory.mktemp("crops_page")) as server:
        yield server


def opened(open_page, server):
    page = open_page(f"{server.base}/")
    page.wait_for_selector("#dates:not([hidden])")  # GET v1/scenes answered frames 3
    return page


def mapped(page):
    """Once the map is shown (fails on a notice): the scene's id, its legend and facts as shown."""
    page.wait_for_selector("#result:not([hidden]), #notice:not(:empty)", timeout=120_000)
    assert page.text_content("#notice") == ""
    legend = list(zip(page.locator("#legend .name").all_text_contents(),
                      page.locator("#legend .figures").all_text_contents()))
    facts = dict(zip(page.locator("#facts dt").all_text_contents(), page.locator("#facts dd").all_text_contents()))
    return page.evaluate("decodeURIComponent(location.hash.slice(1))"), legend, facts


def posted_scene(page, act):
    """Runs `act`; the POST v1/scenes it made."""
    with page.expect_request(lambda r: r.method == "POST" and "/v1/scenes" in r.url) as request:
        act()
    return request.value


def test_the_three_dates_map_as_the_stacked_file_does(crops_server, open_page):
    page = opened(open_page, crops_server)
    assert page.locator(".date-file label:not(.visually-hidden)").all_text_contents() == ["Date 1", "Date 2", "Date 3"]
    assert page.is_hidden("#date-row") and page.text_content("#picker-text") == "Choose a stacked GeoTIFF…"
    assert page.is_disabled("#send-dates")
    unlabelled = page.evaluate("""[...document.querySelectorAll('input, button')]
        .filter(c => !(c.labels?.length || c.getAttribute('aria-label') || c.textContent.trim())).map(c => c.id)""")
    assert unlabelled == []
    for i, (path, date) in enumerate(zip(DATES, GIVEN), 1):
        page.set_input_files(f"#date-file-{i}", str(path))
        page.fill(f"#date-when-{i}", date)
    form = posted_scene(page, lambda: page.click("#send-dates"))
    assert form.url.endswith("/v1/scenes") and form.headers["content-type"].startswith("multipart/form-data; boundary=")
    dated_id, dated_legend, dated_facts = mapped(page)
    assert page.text_content("#job-name") == " + ".join(path.name for path in DATES)
    mask = httpx.get(f"{crops_server.base}/v1/scenes/{dated_id}/mask.tif", timeout=60)
    with rasterio.open(io.BytesIO(mask.content)) as ds:
        assert ds.tags()["acquisition_dates"] == ",".join(GIVEN)  # the form's date field, in order

    stacked = posted_scene(page, lambda: page.set_input_files("#picker", str(STACKED)))
    assert stacked.url.endswith("/v1/scenes?date=" + "%2C".join(GIVEN))  # the same three dates
    stacked_id, stacked_legend, stacked_facts = mapped(page)
    assert stacked_id != dated_id
    assert dated_legend == stacked_legend and len(dated_legend) >= 6, dated_legend  # a crop map, not one class
    assert dated_facts == stacked_facts and dated_facts["Acquired"] == f"{GIVEN[0]} (date given)"
    summaries = [httpx.get(f"{crops_server.base}/v1/scenes/{i}", timeout=60).json()["result"]
                 for i in (dated_id, stacked_id)]
    assert [c["pixels"] for c in summaries[0]["classes"]] == [c["pixels"] for c in summaries[1]["classes"]]
    assert page.problems == []
    page.set_viewport_size(PHONE)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]  # the rows fit a phone


def test_some_dates_are_refused_on_the_page_and_dropped_dates_fill_the_pickers(crops_server, open_page):
    page = opened(open_page, crops_server)
    page.evaluate("""() => {
        const transfer = new DataTransfer();
        for (const name of ['c_date3.tif', 'a_date1.tif', 'b_date2.tif'])
            transfer.items.add(new File(['II*'], name, {type: 'image/tiff'}));
        document.body.dispatchEvent(new DragEvent('drop', {dataTransfer: transfer, bubbles: true, cancelable: true}));
    }""")
    names = page.evaluate("[1, 2, 3].map(i => document.getElementById(`date-file-${i}`).files[0].name)")
    assert names == ["a_date1.tif", "b_date2.tif", "c_date3.tif"]
    assert "in name order" in page.text_content("#notice") and page.is_enabled("#send-dates")
    posts = []
    page.on("request", lambda r: r.method == "POST" and posts.append(r.url))
    page.fill("#date-when-2", GIVEN[1])
    page.click("#send-dates")
    page.wait_for_selector("#notice >> text=Give all 3 acquisition dates, or none (then each file's own is used).")
    assert posts == [] and page.is_hidden("#job")
    assert page.problems == []
