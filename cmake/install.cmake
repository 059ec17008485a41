# Installation and the exported package config (owned by the packaging work).
include(GNUInstallDirs)
