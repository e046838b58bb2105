# The two commands of the README.
.PHONY: app test setup browser lint

setup:
	bash scripts/setup.sh

browser:
	bash scripts/browser.sh

# 1. install everything and open the debugger on the embedded model
app: setup
	.venv/bin/python app.py --preload

# 2. install everything and run the whole suite (browser tests included)
test: setup browser
	bash scripts/test.sh

lint:
	.venv/bin/python -m ruff check engine specviz tests app.py
