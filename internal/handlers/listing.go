package handlers

import (
	"cmp"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/gatehouse/gatehouse/internal/views"
)

// listPageSize is how many rows a sorted list page shows.
const listPageSize = 25

// sortKeys maps a list's sort keys to comparisons of its rows.
type sortKeys[T any] map[string]func(a, b T) int

// byText compares rows by a text column, ignoring case.
func byText[T any](f func(T) string) func(a, b T) int {
	return func(a, b T) int { return cmp.Compare(strings.ToLower(f(a)), strings.ToLower(f(b))) }
}

// sortPage sorts rows by the list's ?sort= and ?dir= (def when missing or
// unknown) and cuts out ?page=. Lists sorted here are ones a page loads
// whole anyway (organizations, departments, environments, agents, keys);
// logs and sessions page by keyset in the database instead.
func sortPage[T any](c echo.Context, rows []T, keys sortKeys[T], def string, extra url.Values) ([]T, views.ListState) {
	l := views.ListState{Base: c.Request().URL.Path, Extra: extra, Sort: c.QueryParam("sort"), Desc: c.QueryParam("dir") == "desc"}
	less, ok := keys[l.Sort]
	if !ok {
		l.Sort, l.Desc, less = def, false, keys[def]
	}
	sorted := slices.Clone(rows)
	slices.SortStableFunc(sorted, func(a, b T) int {
		if l.Desc {
			return less(b, a)
		}
		return less(a, b)
	})
	l.Total = len(sorted)
	l.Pages = max(1, (l.Total+listPageSize-1)/listPageSize)
	l.Page, _ = strconv.Atoi(c.QueryParam("page"))
	l.Page = min(max(l.Page, 1), l.Pages)
	lo := (l.Page - 1) * listPageSize
	return sorted[lo:min(lo+listPageSize, l.Total)], l
}

// cmpTime orders optional times, missing ones first.
func cmpTime(a, b *time.Time) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	return a.Compare(*b)
}
