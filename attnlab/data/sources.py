"""The standard data sets behind `attnlab data get`: where each file comes from, and its checksum.

Each Dataset (data/pinned.py) names a public GitHub repository at a pinned commit and, for each of its
files, the path there, the name it is written under, and the sha256 of its final content (after
the transform, if any: gunzip, or "keep the first N lines"). data/fetch.py's ``fetch`` writes them.

Every data set's test files are fetched too (``test=True``: the standard test sets, SCAN's
other splits, ETT's whole files with their test months); ``--dev-only`` leaves them out.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.config import did_you_mean
from attnlab.data.pinned import Dataset, SourceFile, manifest_files
from attnlab.errors import DataError, UsageError


def _multi30k(split: str, lang: str, size: int, sha256: str, test: bool = False) -> SourceFile:
    """A Multi30k file, gzipped in the repository; a test file's pin is of its .gz (stored)."""
    return SourceFile(
        f"data/task1/raw/{split}.{lang}.gz", f"{split}.{lang}", size, sha256, gunzip=True, test=test, stored=test
    )


MULTI30K_TESTS = {  # test set -> (de, en): the .gz files' bytes and sha256 at the pinned commit
    "test_2016_flickr": (
        (22_890, "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8"),
        (21_077, "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9"),
    ),
    "test_2017_flickr": (
        (21_471, "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee"),
        (19_138, "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074"),
    ),
    "test_2017_mscoco": (
        (10_230, "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338"),
        (8_844, "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58"),
    ),
    "test_2018_flickr": (
        (26_461, "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608"),
        (23_514, "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d"),
    ),
}
SCAN_FILES = (  # path, bytes, sha256, test split; the simple and length splits' training files are development
    (
        "simple_split/tasks_train_simple.txt",
        3_267_938,
        "941bb8a088c5f53ceff12fde902dc008933cf0c4203cc672c47b5f79d73262dd",
        False,
    ),
    (
        "simple_split/tasks_test_simple.txt",
        812_450,
        "1fe1c8f5a19d0dc40e41bab94278f45f66f3dc415a978bd29855a23440610fc6",
        False,
    ),
    (
        "length_split/tasks_train_length.txt",
        2_723_418,
        "b034212dc7cf87ce62f3a067dd6ad49c4d5cd18d51d615d13825516bcb1ebbc2",
        False,
    ),
    (
        "length_split/tasks_test_length.txt",
        1_356_970,
        "0760752ed34a75116ae11dcc1ee17526b7500060da1366540730fa24894d7db3",
        True,
    ),
    ("tasks.txt", 4_080_388, "d824c7d9e9149ba497e25f701981dac79954e04bf670d22e5c209f076ac6c89f", True),
    (
        "add_prim_split/tasks_train_addprim_jump.txt",
        2_579_619,
        "e3c78485692e028eed4205e1b8b3fd0e785ef2c12d45b5b89204dadf5b239e23",
        True,
    ),
    (
        "add_prim_split/tasks_test_addprim_jump.txt",
        1_531_555,
        "8147ae2651422c701162e174d9d66158daa57858a26b30317ac61797118ac7a5",
        True,
    ),
    (
        "add_prim_split/tasks_train_addprim_turn_left.txt",
        3_974_537,
        "1b3fed86055dd7689d217f1b90cc8960aeb1cf200f4f209dc47935761b05304c",
        True,
    ),
    (
        "add_prim_split/tasks_test_addprim_turn_left.txt",
        173_679,
        "15a82c2d25ac7c3c1fff7e18051fb085974ef3617de895c520d02144396a10e2",
        True,
    ),
    (
        "template_split/tasks_train_template_around_right.txt",
        2_558_693,
        "d5d35d174d557645fc61f289424afa0d95fde21422c59a9819e2d0fcfa9d419f",
        True,
    ),
    (
        "template_split/tasks_test_template_around_right.txt",
        1_243_177,
        "fc78a5d1077dc2c206d6c42ed89fb9022867618c3f331179bafd3ec1ca699474",
        True,
    ),
    (
        "template_split/tasks_train_template_jump_around_right.txt",
        3_468_272,
        "f63ba9149feeb021fbb44132265d7b15e6a07e6b12c9d3220418d97d97d71735",
        True,
    ),
    (
        "template_split/tasks_test_template_jump_around_right.txt",
        333_598,
        "a3a27e06adece97da26ae506de08c4b6848035970c561691edbf4dcb1e45f9af",
        True,
    ),
    (
        "template_split/tasks_train_template_opposite_right.txt",
        2_990_057,
        "b4fe224a2dd636952a90b7e5552017620ab07e0c465db0ee2dddfb0f727feeb6",
        True,
    ),
    (
        "template_split/tasks_test_template_opposite_right.txt",
        871_363,
        "e7fc129633f82decd39248517a8945385b77009f721f9f4f58df213f73a29a47",
        True,
    ),
    (
        "template_split/tasks_train_template_right.txt",
        3_173_282,
        "a09e125dc95c59843d087fd50852c57bc4e77997e2cd69aa04a9a934eea9089b",
        True,
    ),
    (
        "template_split/tasks_test_template_right.txt",
        729_823,
        "506bed814f8a6ec1eef9c226eb9b2055bc984925902a94d020a23a41080993bb",
        True,
    ),
)


FSDD_MANIFEST = Path(__file__).parent / "manifests" / "fsdd.SHA256SUMS"  # all 3,000 files of tag v1.0.10
FSDD_FILES = manifest_files(FSDD_MANIFEST.read_text())


def listing(names: list[str], most: int = 8) -> str:
    """``names`` joined by commas, or, past ``most`` of them, counted by folder ('test/ (300 files)'):
    a data set of thousands of files still says what it wrote or lacks in one line."""
    if len(names) <= most:
        return ", ".join(names)
    folders: dict[str, int] = {}
    for name in names:
        folder = name.split("/", 1)[0] + "/" if "/" in name else "."
        folders[folder] = folders.get(folder, 0) + 1
    return ", ".join(f"{folder} ({n:,} file{'s' if n > 1 else ''})" for folder, n in folders.items())


ETT_ROWS = 11_520  # the training (8,640) and validation (2,880) hours of the standard split

DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset(
            name="multi30k",
            repo="multi30k/dataset",
            commit="a3d2e0d26b56f3846f66a952536ffed4e401d05a",
            licence="no licence file; the text is for non-commercial research and education (Flickr30K terms)",
            citation="Elliott, Frank, Sima'an & Specia (2016). Multi30K: Multilingual English-German Image "
            "Descriptions. Proc. 5th Workshop on Vision and Language.",
            files=(
                _multi30k("train", "de", 2_110_398, "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72"),
                _multi30k("train", "en", 1_801_238, "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6"),
                _multi30k("val", "de", 75_981, "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660"),
                _multi30k("val", "en", 63_297, "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227"),
                *(
                    _multi30k(name, lang, *pin, test=True)
                    for name, pins in MULTI30K_TESTS.items()
                    for lang, pin in zip(("de", "en"), pins)
                ),
            ),
            test_sets={name: (f"{name}.de", f"{name}.en") for name in MULTI30K_TESTS},
        ),
        Dataset(
            name="scan",
            repo="brendenlake/SCAN",
            commit="c4b756cbc010d75c912f16c42c8f15dc6b7e6c8f",
            licence="BSD 3-clause (Facebook, Inc.): keep the notice when redistributing",
            citation="Lake & Baroni (2018). Generalization without systematicity: On the compositional skills "
            "of sequence-to-sequence recurrent networks. ICML 2018.",
            files=tuple(SourceFile(path, path, size, sha256, test=test) for path, size, sha256, test in SCAN_FILES),
        ),
        Dataset(
            name="tiny_shakespeare",
            repo="karpathy/char-rnn",
            commit="6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e",
            licence="MIT (char-rnn); the text itself is in the public domain",
            citation="Karpathy (2015). char-rnn. https://github.com/karpathy/char-rnn",
            files=(
                SourceFile(
                    "data/tinyshakespeare/input.txt",
                    "input.txt",
                    1_115_394,
                    "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
                ),
            ),
        ),
        Dataset(
            name="sst2",
            repo="clairett/pytorch-sentiment-classification",
            commit="457ffd83de90a9d6d472d8ffc31bbffe40a8b236",
            licence="no licence file; the Stanford Sentiment Treebank is published for research use",
            citation="Socher et al. (2013). Recursive Deep Models for Semantic Compositionality Over a Sentiment "
            "Treebank. EMNLP 2013.",
            files=(
                SourceFile(
                    "data/SST2/train.tsv",
                    "train.tsv",
                    720_259,
                    "ec192f833a64da08f475488a77b0d0b47db47acd0f458bd18433fc793b569920",
                ),
                SourceFile(
                    "data/SST2/dev.tsv",
                    "dev.tsv",
                    92_057,
                    "eddea6b39e601dd4e7a672b53cc40fdf6019fa80522f351206c24340ca5d9359",
                ),
                SourceFile(
                    "data/SST2/test.tsv",
                    "test.tsv",
                    188_749,
                    "831169c7e2e429d6026e1bdbb542f33b636e3e596caad9602ebc953c205928b7",
                    test=True,
                ),
            ),
            test_sets={"test": ("test.tsv",)},
        ),
        Dataset(
            name="ett",
            repo="zhouhaoyi/ETDataset",
            commit="1d16c8f4f943005d613b5bc962e9eeb06058cf07",
            licence="CC BY-ND 4.0: share with attribution, do not distribute modified versions",
            citation="Zhou et al. (2021). Informer: Beyond Efficient Transformer for Long Sequence Time-Series "
            "Forecasting. AAAI 2021.",
            files=tuple(
                file
                for series, whole, development in (
                    (
                        "ETTh1",
                        (2_589_657, "f18de3ad269cef59bb07b5438d79bb3042d3be49bdeecf01c1cd6d29695ee066"),
                        (1_711_301, "0ac0ce309049e14728c529a0fa98e682edecf8650331c5b977e5a8dc3636b3b0"),
                    ),
                    (
                        "ETTh2",
                        (2_417_960, "a3dc2c597b9218c7ce1cd55eb77b283fd459a1d09d753063f944967dd6b9218b"),
                        (1_599_807, "b3609c990d57344f0e186ea337c077453dc1b83fdb6b36952537b5a8bf5fed0a"),
                    ),
                )
                for file in (
                    # the whole file (its last months are the test split: the recipes read this one), and its
                    # training and validation months alone, the header then the rows (--dev-only)
                    SourceFile(f"ETT-small/{series}.csv", f"{series}.csv", *whole, test=True),
                    SourceFile(
                        f"ETT-small/{series}.csv", f"{series}_train_val.csv", *development, first_lines=1 + ETT_ROWS
                    ),
                )
            ),
            test_sets={"ETTh1": ("ETTh1.csv",), "ETTh2": ("ETTh2.csv",)},
        ),  # scored on their test months
        Dataset(
            name="fsdd",
            repo="Jakobovski/free-spoken-digit-dataset",
            commit="d6938f9bf1545aa66d8489fc9f1385a7abd64282",  # tag v1.0.10
            licence="CC BY-SA 4.0: share with attribution, under the same licence",
            citation="Jackson et al. (2018). Free Spoken Digit Dataset (Jakobovski/free-spoken-digit-dataset), "
            "v1.0.10. Zenodo. doi:10.5281/zenodo.1342401",
            files=FSDD_FILES,
            test_sets={"test": tuple(f.name for f in FSDD_FILES if f.test)},  # the recordings 0-4
            flat_copy=True,
        ),
    )
}


def lookup(name: str) -> Dataset:
    """The registered data set of that name; an unknown one is refused, listing the valid names."""
    if name not in DATASETS:
        raise UsageError(f"unknown data set {name!r}; choose from {', '.join(DATASETS)}{did_you_mean(name, DATASETS)}")
    return DATASETS[name]


def test_set_files(spec: str, root: Path = Path("data")) -> list[Path]:
    """The files of the standard test set ``spec`` ('DATASET:NAME': multi30k:test_2016_flickr,
    sst2:test, ett:ETTh1) where `attnlab data get DATASET` writes them, under ``root``."""
    name, _, set_name = spec.partition(":")
    dataset = lookup(name)
    if set_name not in dataset.test_sets:
        known = ", ".join(f"{dataset.name}:{s}" for s in dataset.test_sets) or "none"
        raise UsageError(f"--test-set {spec}: the test sets of {dataset.name} are {known}")
    files = [root / dataset.name / f for f in dataset.test_sets[set_name]]
    for file in files:
        if not file.is_file():
            raise no_such_file(file)
    return files


def no_such_file(path: Path) -> DataError:
    """The one-line error for a missing data file; under data/NAME/ of a registered data set it names
    the command that writes it."""
    parts = path.parts
    names = [name for folder, name in zip(parts, parts[1:-1]) if folder == "data" and name in DATASETS]
    hint = f"; `attnlab data get {names[-1]}` writes it (run from the folder that holds data/)" if names else ""
    return DataError(f"{path}: no such file{hint}")
