variable "name" {
  description = "Name prefix for the VPC and everything in it (e.g. loraplex-dev)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,30}$", var.name))
    error_message = "name must be 3-31 characters of lowercase letters, digits and dashes, starting with a letter."
  }
}

variable "cidr" {
  description = "IPv4 block of the VPC; a /16 (pods take VPC addresses under the VPC CNI, so the private subnets are /19)."
  type        = string

  validation {
    condition     = can(cidrhost(var.cidr, 0)) && tonumber(split("/", var.cidr)[1]) == 16
    error_message = "cidr must be a valid IPv4 /16, e.g. 10.40.0.0/16."
  }
}

variable "azs" {
  description = "The three availability zones the subnets are spread over (named, so a new zone never moves them)."
  type        = list(string)

  validation {
    condition     = length(var.azs) == 3 && length(distinct(var.azs)) == 3
    error_message = "azs must name three distinct availability zones."
  }
}

variable "single_nat_gateway" {
  description = "One NAT gateway for all zones (cheaper, dev) instead of one per zone (prod: a zone outage keeps egress)."
  type        = bool
}

variable "log_retention_days" {
  description = "Days to keep the VPC flow logs in CloudWatch."
  type        = number

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a retention CloudWatch accepts (1, 3, 5, 7, 14, 30, 60, 90, ...)."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)

  validation {
    condition     = alltrue([for k, v in var.tags : length(k) > 0 && length(k) <= 128 && length(v) <= 256])
    error_message = "tags need keys of 1-128 and values of at most 256 characters (AWS limits)."
  }
}
