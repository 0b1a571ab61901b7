package views

import (
	"net/url"
	"strconv"
)

// ListState is how a list page is sorted and which page of it is shown,
// read from ?sort=, ?dir= and ?page= so every view of a list is a link.
type ListState struct {
	// Base is the page's path; Extra holds other query parameters to keep
	// (filters).
	Base  string
	Extra url.Values
	Sort  string
	Desc  bool
	// Page is 1-based; Pages and Total describe the whole list.
	Page  int
	Pages int
	Total int
}

func (l ListState) url(sort string, desc bool, page int) string {
	v := url.Values{}
	for k, xs := range l.Extra {
		v[k] = xs
	}
	v.Set("sort", sort)
	if desc {
		v.Set("dir", "desc")
	}
	if page > 1 {
		v.Set("page", strconv.Itoa(page))
	}
	return l.Base + "?" + v.Encode()
}

// SortURL sorts by key, reversing the order when it already sorts by key.
func (l ListState) SortURL(key string) string {
	return l.url(key, key == l.Sort && !l.Desc, 1)
}

// PageURL is page n in the current order.
func (l ListState) PageURL(n int) string { return l.url(l.Sort, l.Desc, n) }

// ariaSort is the header's aria-sort value, empty for unsorted columns.
func (l ListState) ariaSort(key string) string {
	switch {
	case key != l.Sort:
		return ""
	case l.Desc:
		return "descending"
	}
	return "ascending"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return thousands(n) + " " + many
}
