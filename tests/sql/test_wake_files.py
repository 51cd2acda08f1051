"""
The wake file is no way in: it is opened without following symlinks, must be
a regular file of the process's user, and lives in a directory only that
user can write.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from unittest import mock

from django.test import SimpleTestCase

from pikku_django.sql import wake_files


class WakeFileTests(SimpleTestCase):
    def setUp(self) -> None:
        self.dir = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.dir)
        os.chmod(self.dir, 0o700)
        self.target = self.dir / "precious"
        self.target.write_bytes(b"x" * 2048)

    def test_a_planted_symlink_is_not_followed(self) -> None:
        link = self.dir / "wake"
        link.symlink_to(self.target)
        with mock.patch.object(wake_files, "wake_file", return_value=str(link)):
            wake_files.touch("default")
        assert self.target.read_bytes() == b"x" * 2048
        assert link.is_symlink()

    def test_the_wake_file_lives_in_a_directory_only_its_user_can_write(self) -> None:
        with mock.patch.object(wake_files, "wake_vendor", return_value="mysql"):
            path = wake_files.wake_file("default")
        assert path is not None
        folder = os.lstat(os.path.dirname(path))
        assert stat.S_ISDIR(folder.st_mode) and folder.st_uid == os.getuid()
        assert folder.st_mode & 0o077 == 0
        with mock.patch.object(wake_files, "wake_file", return_value=path):
            wake_files.touch("default")
        made = os.lstat(path)
        assert stat.S_ISREG(made.st_mode) and made.st_uid == os.getuid() and made.st_mode & 0o077 == 0

    def test_a_directory_others_can_write_is_refused(self) -> None:
        shared = self.dir / "shared"
        shared.mkdir()
        os.chmod(shared, 0o777)  # noqa: S103  (the directory others could plant a file in)
        assert wake_files.private_directory(str(shared)) is None
