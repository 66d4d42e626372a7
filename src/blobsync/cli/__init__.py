"""The command line: click commands that turn flags into a TransferConfig and call the library."""
